"""Smoke tests of ``env-speed`` and ``peers-speed`` (tiny counts, no timing claims), and
of the side-by-side machinery with VT's own worker on both sides."""

from __future__ import annotations

import json
import sys

import pytest

from vt_bench.__main__ import main
from vt_bench.peers.ab import Worker, WorkerError, alternate
from vt_bench.peers.work import MATH_PAIRS


def test_env_speed_plays_each_oracle_through_gym_make(tmp_path, capsys):
    argv = ["--env-ids", "VT-Lookup-v0", "VT-Math-v0", "--episodes", "3", "--seconds", "1",
            "--overhead-episodes", "20"]  # fmt: skip
    assert main(["env-speed", *argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "env_speed.json").read_text())
    assert report["overhead"]["episodes"] == 20 and report["overhead"]["us_per_episode"] > 0
    for env_id in ("VT-Lookup-v0", "VT-Math-v0"):
        m = report["envs"][env_id]
        assert m["episodes"] == 3 and m["mean_reward"] == 1.0 and m["steps_per_s"] > 0
        assert m["tool_call"]["n"] == 3  # one call per oracle episode
    out = capsys.readouterr().out
    assert "| VT-Math-v0 |" in out and "Env overhead (VT-Lookup-v0" in out


def test_alternating_rounds_time_each_side_and_keep_its_checks():
    params = {"pairs": MATH_PAIRS}
    a, b = (
        Worker(sys.executable, "vt_grade.py", params),
        Worker(sys.executable, "vt_grade.py", params),
    )
    try:
        result = alternate(a, b, n=len(MATH_PAIRS), rounds=3)
    finally:
        a.close(), b.close()
    assert len(result["rates"]["vt"]) == len(result["rates"]["peer"]) == 3
    assert result["checks"]["vt"] == result["checks"]["peer"]  # the same verdicts
    # MATH_PAIRS holds 3 wrong answers; VT's verifier must reject exactly those.
    assert result["checks"]["vt"][0] == len(MATH_PAIRS) - 3
    assert result["ratio"] == pytest.approx(result["vt_per_s"] / result["peer_per_s"])


def test_a_worker_that_cannot_import_its_library_is_reported():
    with pytest.raises(WorkerError, match="ModuleNotFoundError"):
        Worker(sys.executable, "gem_grade.py", {"pairs": []})  # no GEM in VT's venv


def test_without_peers_every_comparison_is_skipped_with_the_reason(tmp_path, capsys):
    assert main(["peers-speed", "--peers", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "peers_speed.json").read_text())
    assert all("skipped" in r for r in report["comparisons"].values())
    assert "no SkyRL-gym venv" in capsys.readouterr().out


def test_generation_speed_reports_both_sides(tmp_path, capsys):
    argv = ["--rounds", "1", "--batch", "2", "--new-tokens", "4", "--prompt-tokens", "8"]
    assert main(["generation-speed", *argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "generation_speed.json").read_text())
    assert report["engine_tokens_per_s"] > 0 and report["generate_tokens_per_s"] > 0
    assert "HFEngine ÷ generate" in capsys.readouterr().out


def test_multiturn_speed_counts_what_each_side_prefills(tmp_path, capsys):
    import argparse

    from vt_bench import multiturn_speed

    parser = argparse.ArgumentParser()
    multiturn_speed.add_arguments(parser)
    args = parser.parse_args(
        ["--model", "tiny", "--episodes", "3", "--turns", "3", "--prompt-tokens", "20",
         "--obs-tokens", "5", "--new-tokens", "6", "--out", str(tmp_path)]
    )  # fmt: skip
    assert multiturn_speed.main(args) == 0
    sides = json.loads((tmp_path / "multiturn_speed.json").read_text())["sides"]
    # The cache: the first prompt, then each turn's never-fed last token and observation.
    assert sides["prefix cache"]["prefill_per_episode"] == 20 + 2 * (1 + 5)
    # Without it every turn prefills the whole conversation: at most 20, 20+6+5, 20+2*(6+5)
    # (a turn that ends at eos is shorter).
    assert sides["re-prefill"]["prefill_per_episode"] <= 20 + 31 + 42
    assert sides["re-prefill"]["prefill_per_episode"] > sides["prefix cache"]["prefill_per_episode"]
    assert sides["generate"]["prefill_per_episode"] == 20 + 31 + 42  # generate pads to length
    assert "| prefix cache |" in capsys.readouterr().out


PHASED_WORKER = """
import sys
sys.path.insert(0, {workers!r})
from _loop import serve

def run(state, n):
    return n, 0, 2.0 * n, {{"rollout": 0.5 * n, "update": 1.5 * n}}

serve(lambda params: None, run)
"""


def test_the_parts_a_worker_times_are_reported_per_item_and_rendered(tmp_path):
    from vt_bench.peers.ab import WORKERS
    from vt_bench.peers_speed import render

    script = tmp_path / "phased.py"
    script.write_text(PHASED_WORKER.format(workers=str(WORKERS)))
    a, b = Worker(sys.executable, str(script), {}), Worker(sys.executable, str(script), {})
    try:
        result = alternate(a, b, n=4, rounds=2)
    finally:
        a.close()
        b.close()
    assert result["phases_s_per_item"]["vt"] == {"rollout": 0.5, "update": 1.5}
    assert result["vt_per_s"] == pytest.approx(0.5)  # 4 items in the 8 s the worker timed
    report = {"comparisons": {"x": {**result, "what": "w", "peer": "P", "unit": "steps"}}}
    assert "- `x`, P, seconds per step: rollout 0.50 s, update 1.50 s" in render(report)
