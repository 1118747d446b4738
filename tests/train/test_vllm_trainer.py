"""The trainer with the vLLM engine, end to end (vllm-cpu here, vllm on a GPU box).

Marked ``vllm``: ``make test-vllm`` runs it in its own virtualenv. A tiny policy
is first warmed up on VT-Lookup-v0's oracle (``vt-train sft``: ~30 s) so that
it calls the tool and answers, over two turns; a random model would end every episode
in one turn and earn no reward, which tests neither the boundaries nor the sync.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

import vt_envs
from vt_envs.core.loop import run_sync
from vt_envs.vector import ToolVectorEnv
from vt_train.engines import SamplingParams, make_engine
from vt_train.rollout import collect

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ENGINE_KWARGS = {"max_model_len": 512, "max_num_seqs": 16, "enforce_eager": True}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from vt_train.model import TinyModelConfig
    from vt_train.sft import SFTConfig, SFTRunConfig, run_sft_command

    out = tmp_path_factory.mktemp("sft")
    summary = run_sft_command(
        SFTRunConfig(
            model=TinyModelConfig(max_position_embeddings=512),  # head_dim 32: vLLM's CPU minimum
            sft=SFTConfig(steps=300, lr=1e-3),
            mix_steps=0,  # oracle only: greedy, it always calls the tool first
            output_dir=str(out),
            eval_episodes=0,
        )
    )
    return summary["model_dir"]


def _episodes(engine, task_ids):
    tok = vt_envs.load_tokenizer()
    venv = ToolVectorEnv([vt_envs.make("VT-Lookup-v0", split="test", tokenizer=tok)] * 1)
    try:
        return run_sync(
            collect(
                engine,
                venv,
                task_ids,
                sampling=SamplingParams(max_new_tokens=24, temperature=0.0),
                max_context=512,
            ),
            method="test",
            async_method="collect",
        )
    finally:
        venv.close()


def test_env_stop_strings_engine_stops_and_boundary_tokens_agree(policy_dir):
    """One greedy multi-turn episode per task through vLLM and through the HF engine:
    the same actions, cut at the same stop strings, the same token ids (boundaries
    included) and the same logprobs."""
    from transformers import AutoModelForCausalLM

    task_ids = [f"lookup/test/{i}" for i in range(8)]
    vllm_engine = make_engine(
        "vllm", model_path=policy_dir, tokenizer=policy_dir, dtype="float32", **ENGINE_KWARGS
    )
    try:
        served = _episodes(vllm_engine, task_ids)
    finally:
        vllm_engine.close()
    model = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True).float()
    local = _episodes(make_engine("hf", model=model.eval(), tokenizer=policy_dir), task_ids)
    multi_turn = [t for t in served if t.tool_calls >= 1 and t.turns >= 2]
    assert len(multi_turn) >= 6, [t.actions for t in served]
    for a, b in zip(served, local):
        assert a.actions == b.actions
        assert a.finish_reasons == b.finish_reasons
        assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
        assert a.rollout_logprobs == pytest.approx(b.rollout_logprobs, abs=2e-3)
    for t in multi_turn:  # each tool call stopped right after its closing tag
        assert t.actions[0].endswith("</lookup>") and t.finish_reasons[0] == "stop"
        assert t.reward == 1.0 or t.actions[-1].startswith("<answer>")


def test_the_trainer_runs_grpo_steps_with_vllm_and_syncs_its_weights(policy_dir, tmp_path):
    """``vt-train`` itself: two GRPO steps on the vLLM engine, the weights pushed
    after each, and the sync check (fp32: mean gap < 1e-3) passing every time."""
    from vt_train.cli import main

    out = tmp_path / "run"
    overrides = [
        f"init_from={policy_dir}",
        "rollout.engine=vllm",
        f"rollout.engine_kwargs={json.dumps(ENGINE_KWARGS)}",
        "rollout.tasks_per_step=4",
        "rollout.n=4",
        "rollout.max_new_tokens=24",
        "rollout.max_context=512",
        "rollout.sync_check=true",
        "optim.minibatch_size=8",
        "optim.micro_batch_size=4",
        "optim.lr=1e-3",  # large, so a stale engine would be caught
        "algorithm.entropy_coef=0.01",  # a gradient even if every group's rewards are equal
        "env.eval_episodes=8",
        "steps=2",
        "tensorboard=false",
        f"output_dir={out}",
    ]
    assert main(overrides) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "policy/grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert record["policy/grad_norm"] > 0
        assert record["sync/mean_abs_logprob_diff"] < 1e-3
        # the engine sampled under the weights the trainer scored them with
        assert record["rollout/logprob_abs_diff"] < 1e-3
    assert (out / "final" / "model.safetensors").is_file()
