"""Data parallel under torchrun: 2 ranks compute exactly the 1-process update.

Two CPU processes (gloo) each play half of a step's tasks and train on their
rows of every minibatch; the test replays the gathered trajectories in one
process and checks that the new weights and every logged metric match, at
every ZeRO stage. ZeRO-3 gathers a module's parameters at each call, so the
ranks must make the same module calls (vt_train.lockstep); the workload is
built so that they would not otherwise:

- LM-head chunks of 8 positions: ranks whose rows hold different numbers of
  generated tokens need different numbers of chunks;
- minibatches of 3 rows learned with micro-batches of 2: rank 0's two rows
  share their system prompt and take the shared-prefix path (two decoder
  calls), rank 1's single row the plain one;
- then micro-batches of 1: rank 1 has no row for rank 0's second pass and
  runs a dummy one;
- the reference model (KL) and the critic (PPO) are scored on each rank's own
  share of the rows, then all-gathered;
- a vision-language policy whose batch holds one image: one rank runs the
  vision tower, the other must too;
- one engine over both ranks (tensor parallelism 2, simulated): rank 0 plays
  every task, rank 1 none, and both walk the weight stream (its gathers are
  collectives under ZeRO-3).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dp_worker import MICRO_BATCHES, learn_twice
from train_helpers import dp_overrides, saved_tiny_model

from vt_train.config import load_config
from vt_train.ds_engine import RENDEZVOUS_VARS
from vt_train.trainer import Trainer

LOGGED = (
    "policy/pg_loss",
    "policy/entropy",
    "policy/clip_frac",
    "policy/approx_kl",
    "policy/grad_norm",
    "critic/vf_loss",
    "rollout/advantage_abs_mean",
)
#: PPO with a critic and a KL reference: every model the prepare phase scores.
PPO = ["algo=ppo", "algorithm={kl_coef: 0.01}"]


def _two_ranks(tmp_path: Path, mode: str, extra: list[str]) -> dict:
    worker = Path(__file__).with_name("dp_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in RENDEZVOUS_VARS:
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(worker), mode, str(tmp_path), *extra,
    ]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    dp = pickle.loads((tmp_path / "dp.pkl").read_bytes())
    assert dp["world"] == 2
    return dp


def _assert_same(single: Trainer, metrics: list[dict], dp: dict) -> None:
    for mine, theirs in zip(metrics, dp["metrics"], strict=True):
        for key in LOGGED:  # summed over micro-batches and all-reduced over ranks
            if key in mine:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    for name, value in single.actor.full_state_dict().items():
        torch.testing.assert_close(value, dp["state"][name], rtol=0, atol=1e-5, msg=name)


# ZeRO-1 and -2 lie between 0 (no partitioning) and 3 (parameters gathered per
# call, where ranks must make the same module calls): `make test-all` runs them.
@pytest.mark.parametrize(
    "stage",
    [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3],
)
def test_two_ranks_match_one_process(tmp_path, stage):
    extra = [*PPO, f"deepspeed.zero_stage={stage}"]
    dp = _two_ranks(tmp_path, "text", extra)
    trajectories = dp["trajectories"]
    assert sorted({t.group_id for t in trajectories}) == list(range(6))
    assert [t.reward for t in trajectories].count(1.0) == 6  # one of each pair is right
    assert len(dp["metrics"]) == len(MICRO_BATCHES)

    out = f"output_dir={tmp_path / 'single'}"
    single = Trainer(load_config(None, [*dp_overrides("text"), out, *extra]))
    assert single.world == 1
    _assert_same(single, learn_twice(single, trajectories), dp)
    single.close()


def test_a_rank_without_an_engine_trains_on_its_leaders_rollouts(tmp_path):
    """Also: the models come from a directory, so ZeRO-3 builds them partitioned."""
    model = saved_tiny_model(tmp_path / "model")
    extra = [*PPO, "deepspeed.zero_stage=3", f"model.path={model}"]
    dp = _two_ranks(tmp_path, "tp2", extra)
    assert sorted({t.group_id for t in dp["trajectories"]}) == list(range(6))
    single = Trainer(
        load_config(None, [*dp_overrides("text"), f"output_dir={tmp_path / 's'}", *extra])
    )
    _assert_same(single, learn_twice(single, dp["trajectories"]), dp)
    single.close()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_match_one_process_with_images_on_one_rank(tmp_path, stage):
    from train_helpers import vl_trajectories

    extra = [f"deepspeed.zero_stage={stage}"]
    dp = _two_ranks(tmp_path, "vl", extra)
    assert sum(bool(t.images) for t in dp["trajectories"]) == 1

    out = f"output_dir={tmp_path / 'single'}"
    single = Trainer(load_config(None, [*dp_overrides("vl"), out, *extra]))
    trajectories = vl_trajectories(single)
    assert [t.input_ids for t in trajectories] == [t.input_ids for t in dp["trajectories"]]
    _assert_same(single, [single.learn(trajectories)], dp)
    single.close()
