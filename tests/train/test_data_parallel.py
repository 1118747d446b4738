"""Data parallel under torchrun: 2 ranks compute exactly the 1-process update.

Two CPU processes (gloo) each play half of a step's tasks and train on their
rows of every minibatch; the test replays the gathered trajectories in one
process and checks that the new weights and every logged metric match, at
ZeRO-0 and at ZeRO-2 (where each rank holds half of the optimizer state and
gradients).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import DP_OVERRIDES

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
)


@pytest.mark.parametrize("stage", [0, 2])
def test_two_ranks_match_one_process(tmp_path, stage):
    extra = ["algo=ppo", f"deepspeed.zero_stage={stage}"]
    worker = Path(__file__).with_name("dp_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in RENDEZVOUS_VARS:
        env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(worker),
        str(tmp_path),
        *extra,
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    dp = pickle.loads((tmp_path / "dp.pkl").read_bytes())
    assert dp["world"] == 2
    trajectories = dp["trajectories"]
    assert sorted({t.group_id for t in trajectories}) == [0, 1, 2, 3]
    assert [t.reward for t in trajectories].count(1.0) == 8  # half of each group is right

    single = Trainer(
        load_config(None, [*DP_OVERRIDES, f"output_dir={tmp_path / 'single'}", *extra])
    )
    assert single.world == 1
    metrics = single.learn(trajectories)
    for key in LOGGED:  # summed over micro-batches and all-reduced over ranks
        assert metrics[key] == pytest.approx(dp["metrics"][key], rel=1e-4, abs=1e-7), key
    for name, value in single.actor.full_state_dict().items():
        torch.testing.assert_close(value, dp["state"][name], rtol=0, atol=1e-5)
    single.close()
