"""Run by ``torchrun`` from test_data_parallel.py: one data-parallel RL step.

Each rank plays its share of the step's tasks with a scripted engine; rank 0
saves the gathered trajectories, the step's metrics and the new weights.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_helpers import DP_OVERRIDES, ScriptedLookupPolicy

from vt_train.config import load_config
from vt_train.engines import ScriptedEngine
from vt_train.trainer import Trainer


def main(out: Path, extra: list[str]) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(load_config(None, [*DP_OVERRIDES, f"output_dir={out / 'run'}", *extra]))
    policy = ScriptedLookupPolicy()
    trainer.engine = ScriptedEngine(
        policy, eos_token_id=policy.tok.eos_token_id, tokenizer=policy.tok
    )
    trajectories = trainer.rollout()
    metrics = trainer.learn(trajectories)
    state = trainer.actor.full_state_dict()  # a collective under ZeRO-3
    if trainer.is_main:
        payload = {"world": trainer.world, "trajectories": trajectories, "metrics": metrics}
        (out / "dp.pkl").write_bytes(pickle.dumps({**payload, "state": state}))
    trainer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
