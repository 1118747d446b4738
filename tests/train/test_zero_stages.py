"""Every ZeRO stage applies the same update, and logged metrics do not depend on
how a minibatch is split into micro-batches.

One step's trajectories (scripted rollouts, so rewards are known) are learned
by a fresh trainer at each ZeRO stage 0-3 in fp32 on the CPU; the new weights
must equal ZeRO-0's. Before the accumulation boundary was given to DeepSpeed,
ZeRO-1/2 kept only the last micro-batch's gradient (and logged a norm of 0).
"""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import TRAINER_OVERRIDES, ScriptedLookupPolicy

from vt_envs.core.tokenizer import load_tokenizer
from vt_train.config import load_config
from vt_train.engines import ScriptedEngine
from vt_train.trainer import Trainer

TOK = load_tokenizer()
# 8 trajectories; minibatches of 8 split into 4 micro-batches of 2.
OVERRIDES = [*TRAINER_OVERRIDES, "optim.minibatch_size=8", "optim.micro_batch_size=2"]


def _trainer(tmp_path, *extra: str) -> Trainer:
    return Trainer(load_config(None, [*OVERRIDES, f"output_dir={tmp_path}", *extra]))


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    trainer = _trainer(tmp_path_factory.mktemp("rollout"))
    trainer.engine = ScriptedEngine(
        ScriptedLookupPolicy(), eos_token_id=TOK.eos_token_id, tokenizer=TOK
    )
    played = trainer.rollout()
    trainer.close()
    return played


def _learn(tmp_path, trajectories, *extra):
    trainer = _trainer(tmp_path, *extra)
    metrics = trainer.learn(copy.deepcopy(trajectories))
    state = trainer.actor.full_state_dict()
    trainer.close()
    return metrics, state


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_every_zero_stage_applies_the_zero_0_update(tmp_path, trajectories, algo):
    base_metrics, base = _learn(tmp_path / "z0", trajectories, f"algo={algo}")
    assert base_metrics["policy/grad_norm"] > 0
    for stage in (1, 2, 3):
        metrics, state = _learn(
            tmp_path / f"z{stage}", trajectories, f"algo={algo}", f"deepspeed.zero_stage={stage}"
        )
        assert metrics["policy/grad_norm"] == pytest.approx(
            base_metrics["policy/grad_norm"], rel=1e-4
        )
        for name, value in base.items():
            torch.testing.assert_close(
                state[name], value, rtol=0, atol=1e-5, msg=f"ZeRO-{stage} {name}"
            )


LOGGED = (
    "policy/pg_loss",
    "policy/entropy",
    "policy/clip_frac",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/grad_norm",
    "critic/vf_loss",
    "critic/values_mean",
)


def test_logged_metrics_do_not_depend_on_the_micro_batch_count(tmp_path, trajectories):
    one, _ = _learn(tmp_path / "one", trajectories, "algo=ppo", "optim.micro_batch_size=8")
    four, _ = _learn(tmp_path / "four", trajectories, "algo=ppo", "optim.micro_batch_size=2")
    for key in LOGGED:
        assert four[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), key


def test_zero3_builds_models_loaded_from_a_directory_partitioned(tmp_path, trajectories):
    """Under ZeRO-3 the policy, the KL reference and the critic trunk loaded from
    ``model.path`` are built partitioned (vt_train.sharded_load: no rank ever holds a
    whole one), and the update equals ZeRO-0's on the same weights."""
    from train_helpers import saved_tiny_model

    from vt_train.trainer import build as trainer_module  # where _load_partitioned looks it up

    model = saved_tiny_model(tmp_path / "model")
    built = []
    real = trainer_module.load_partitioned

    def recording(path, **kwargs):
        lm = real(path, **kwargs)
        built.append((kwargs["base"], all(hasattr(p, "ds_id") for p in lm.parameters())))
        return lm

    trainer_module.load_partitioned = recording
    try:
        common = ["algo=ppo", "algorithm={kl_coef: 0.01}", f"model.path={model}"]
        base_metrics, base = _learn(tmp_path / "z0", trajectories, *common)
        assert built == []  # ZeRO-0 loads the policy whole and copies it
        metrics, state = _learn(tmp_path / "z3", trajectories, *common, "deepspeed.zero_stage=3")
        assert built == [(False, True), (False, True), (True, True)]  # policy, reference, critic
    finally:
        trainer_module.load_partitioned = real
    assert metrics["policy/grad_norm"] == pytest.approx(base_metrics["policy/grad_norm"], rel=1e-4)
    for name, value in base.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-5, msg=name)
