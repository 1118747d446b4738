"""The trainer's process-level helpers: seeding, this rank's placement, and the few
collectives it makes outside DeepSpeed (each a no-op in a single process)."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from vt_train.config import TrainConfig
from vt_train.placement import Placement, engine_tensor_parallel, plan_placement


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _all_reduce_sums(sums: dict[str, float], world: int, device: torch.device) -> dict[str, float]:
    """``sums`` added over every rank (keys the union of all ranks')."""
    if world == 1:
        return dict(sums)
    import torch.distributed as dist

    keys: list[list[str]] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(keys, sorted(sums))
    union = sorted({k for ks in keys for k in ks})
    values = torch.tensor([sums.get(k, 0.0) for k in union], dtype=torch.float64, device=device)
    dist.all_reduce(values)
    return dict(zip(union, values.cpu().tolist()))


def _all_gather(value: Any, world: int) -> list[Any]:
    """Every rank's ``value``, by rank (``[value]`` in a single process)."""
    if world == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values


def _placement(config: TrainConfig, device: str) -> tuple[Placement, list[int]]:
    """This rank's :class:`Placement` and the ranks that lead an engine (engine order),
    from the launch's variables (torchrun's, or a single process's defaults)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    plan = plan_placement(
        world=world,
        local_world=local_world,
        gpus_per_node=gpus,
        tensor_parallel=engine_tensor_parallel(
            config.rollout.engine, config.rollout.engine_kwargs if gpus else {}
        ),
    )
    return plan[rank], [p.rank for p in plan if p.leads]


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (no-op in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
