"""Run by ``torchrun`` from test_data_parallel.py: data-parallel RL updates.

``text`` mode: each rank plays its share of the step's tasks with a scripted
engine, then the gathered trajectories are learned twice, with micro-batches
of 2 and then of 1 (see test_data_parallel.py for what differs between the
ranks). ``tp2`` mode: the same, placed as one engine over both ranks' devices
(tensor parallelism 2, simulated on the CPU): rank 0 leads it and plays every
task, rank 1 has no engine and plays none. ``vl`` mode: the tiny
vision-language policy learns trajectories built by :func:`vl_trajectories`,
where only one row holds an image.
Rank 0 saves the trajectories, each learn's metrics and the new weights.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_helpers import ScriptedLookupPolicy, dp_overrides, vl_trajectories

from vt_train.config import load_config
from vt_train.engines import ScriptedEngine
from vt_train.trainer import Trainer

#: The micro-batch sizes the text mode learns with, one learn() each.
MICRO_BATCHES = (2, 1)


def learn_twice(trainer: Trainer, trajectories: list) -> list[dict[str, float]]:
    """``trainer.learn`` on ``trajectories`` once per entry of MICRO_BATCHES."""
    metrics = []
    for size in MICRO_BATCHES:
        trainer.config.optim.micro_batch_size = size
        metrics.append(trainer.learn(trajectories))
    return metrics


def _one_engine_over_two_ranks() -> None:
    """Place as on a 2-GPU node with tensor_parallel_size=2, on this CPU."""
    from vt_train.placement import plan_placement
    from vt_train.trainer import loop as trainer_module  # where Trainer looks _placement up

    def placement(config, device):
        plan = plan_placement(world=2, local_world=2, gpus_per_node=2, tensor_parallel=2)
        return plan[int(os.environ["RANK"])], [0]

    trainer_module._placement = placement


def main(mode: str, out: Path, extra: list[str]) -> None:
    torch.set_num_threads(1)
    if mode == "tp2":
        _one_engine_over_two_ranks()
    overrides = dp_overrides("vl" if mode == "vl" else "text")
    trainer = Trainer(load_config(None, [*overrides, f"output_dir={out / 'run'}", *extra]))
    if mode in ("text", "tp2"):
        assert (trainer.engine is None) == (mode == "tp2" and trainer.rank == 1)
        policy = ScriptedLookupPolicy()
        if trainer.engine is not None:
            trainer.engine = ScriptedEngine(
                policy, eos_token_id=policy.tok.eos_token_id, tokenizer=policy.tok
            )
        trajectories = trainer.rollout()
        metrics = learn_twice(trainer, trajectories)
    else:
        trajectories = vl_trajectories(trainer)
        metrics = [trainer.learn(trajectories)]
    state = trainer.actor.full_state_dict()  # a collective under ZeRO-3
    if trainer.is_main:
        payload = {"world": trainer.world, "trajectories": trajectories, "metrics": metrics}
        (out / "dp.pkl").write_bytes(pickle.dumps({**payload, "state": state}))
    trainer.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
