"""The RL trainer end to end on VT-Lookup-v0 with a tiny model.

A scripted rollout engine makes the rewards known (half the samples of every
group look the key up and answer right, half guess wrong), so these tests
check the update path itself: every parameter moves, metrics and files are
written, and a resumed run reproduces the uninterrupted one exactly.
"""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import TRAINER_OVERRIDES, ScriptedLookupPolicy

from vt_envs.core.tokenizer import load_tokenizer
from vt_train.config import load_config
from vt_train.engines import ScriptedEngine
from vt_train.trainer import Trainer

TOK = load_tokenizer()


def make_trainer(tmp_path, *extra: str, responder: ScriptedLookupPolicy | None = None) -> Trainer:
    config = load_config(
        None, [*TRAINER_OVERRIDES, f"output_dir={tmp_path}", "rollout.engine=hf", *extra]
    )
    trainer = Trainer(config)
    trainer.engine = ScriptedEngine(
        responder or ScriptedLookupPolicy(), eos_token_id=TOK.eos_token_id, tokenizer=TOK
    )
    return trainer


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_one_step_moves_every_parameter_and_logs(tmp_path, algo):
    trainer = make_trainer(tmp_path, f"algo={algo}")
    before = {k: v.detach().clone() for k, v in trainer.actor.module.named_parameters()}
    metrics = trainer.step()
    assert metrics["rollout/mean_reward"] == pytest.approx(0.5)
    assert metrics["rollout/all_equal_group_share"] == 0.0
    assert metrics["rollout/advantage_abs_mean"] > 0
    unchanged = [
        k for k, v in trainer.actor.module.named_parameters() if torch.equal(v.detach(), before[k])
    ]
    assert unchanged == []
    assert trainer.engine.weights_version == 1  # the new weights were pushed
    if algo == "ppo":
        assert metrics["critic/vf_loss"] > 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 1 and "policy/clip_frac" in records[-1]
    assert (tmp_path / "config.yaml").read_text().startswith(f"algo: {algo}")
    trainer.close()


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    responder = ScriptedLookupPolicy()
    straight = make_trainer(tmp_path / "a", responder=responder)
    straight.step()
    straight.step()
    calls_at_checkpoint = responder.calls
    straight.save_checkpoint()
    expected = straight.step()
    straight.close()

    resumed_responder = ScriptedLookupPolicy()
    resumed_responder.calls = calls_at_checkpoint  # the scripted policy's own state
    resumed = make_trainer(tmp_path / "b", responder=resumed_responder)
    resumed.run_dir = tmp_path / "a"
    resumed.load_checkpoint()
    assert resumed.step_index == 2
    got = resumed.step()
    resumed.close()
    timing = ("time/", "perf/")
    assert {k: v for k, v in got.items() if not k.startswith(timing)} == {
        k: v for k, v in expected.items() if not k.startswith(timing)
    }


def test_dapo_filters_all_equal_groups(tmp_path):
    trainer = make_trainer(tmp_path, "algo=dapo")
    trainer.engine = ScriptedEngine(
        [TOK.encode("<answer>000</answer>")], eos_token_id=TOK.eos_token_id, tokenizer=TOK
    )
    metrics = trainer.step()  # every sample guesses wrong: no signal, nothing to train on
    assert metrics["rollout/all_equal_group_share"] == 1.0
    assert "policy/pg_loss" not in metrics
    trainer.close()


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_every_tensor_the_step_builds_is_put_on_the_device(tmp_path, algo):
    # No GPU here, so a missing `.to(device)` would pass unnoticed on the CPU.
    # During this step the *default* device is "meta": a tensor the engine or
    # the trainer creates without naming its device lands there, and the first
    # operation that mixes it with the models' CPU tensors fails.
    config = load_config(
        None,
        [
            *TRAINER_OVERRIDES,
            f"output_dir={tmp_path}",
            "rollout.engine=hf",
            "rollout.sync_check=true",
            f"algo={algo}",
            "algorithm={kl_coef: 0.01}",
            "device=cpu",
        ],
    )
    trainer = Trainer(config)
    assert trainer.device == torch.device("cpu")
    torch.set_default_device("meta")
    try:
        metrics = trainer.step()  # rollout with the HF engine, update, weight sync
    finally:
        torch.set_default_device(None)
    assert metrics["sync/mean_abs_logprob_diff"] < 1e-3
    trainer.close()
