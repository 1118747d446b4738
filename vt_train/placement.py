"""Where each rank trains and where the rollout engines run (colocated, TP groups).

Under ``torchrun`` each rank trains on its own GPU, ``cuda:LOCAL_RANK``. The
rollout engines share those GPUs (vLLM's ``gpu_memory_utilization`` is its
share of each one), one engine per **tensor-parallel group**: with
``tensor_parallel_size = t``, the ranks of a node form groups of ``t``
consecutive local ranks, and the group's first rank (its *leader*) owns an
engine whose ``t`` shards sit on exactly the group's ``t`` GPUs. So every GPU
holds one training rank and one engine shard, never two of either:

    8 GPUs, TP 2:  GPU  0 1 | 2 3 | 4 5 | 6 7
                   rank 0 1 | 2 3 | 4 5 | 6 7     (training, cuda:LOCAL_RANK)
                   engine 0 | 1   | 2   | 3       (led by ranks 0, 2, 4, 6)

Leaders play the step's tasks (task ``i`` on engine ``i % engines``) and the
other ranks of a group play none; every rank trains on its share of every
minibatch. With ``t = 1`` every rank leads an engine on its own GPU (and on
the CPU, where there are no devices, every rank has its own engine).

:func:`plan_placement` builds the plan for a simulated or real world and
:func:`check_placement` refuses one where a GPU would hold two training
ranks or two engine shards, or a device that does not exist.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from vt_envs.errors import InvalidConfigError, VTError

__all__ = [
    "Placement",
    "PlacementError",
    "check_placement",
    "engine_tensor_parallel",
    "physical_devices",
    "plan_placement",
]


class PlacementError(VTError, ValueError):
    """Raised when a launch would put two training ranks or two engine shards on one
    device, or an engine on a device that does not exist."""


@dataclass(frozen=True)
class Placement:
    """One rank's place.

    Attributes:
        rank, local_rank, node: the rank, its index on its node, its node.
        train_device: the local GPU it trains on (``None`` on the CPU).
        engine: the index of the engine this rank leads, or ``None``.
        engine_devices: the local GPUs of that engine's shards (empty if none,
            or on the CPU).
        leader: the rank whose engine plays this rank's group's tasks.
    """

    rank: int
    local_rank: int
    node: int
    train_device: int | None
    engine: int | None
    engine_devices: tuple[int, ...]
    leader: int

    @property
    def leads(self) -> bool:
        return self.engine is not None


def plan_placement(
    *,
    world: int,
    local_world: int,
    gpus_per_node: int,
    tensor_parallel: int = 1,
) -> list[Placement]:
    """Every rank's placement (see the module docstring).

    Args:
        world: ranks in all (``WORLD_SIZE``).
        local_world: ranks per node (``LOCAL_WORLD_SIZE``); ``world`` must be a
            multiple of it.
        gpus_per_node: GPUs each node has (0: a CPU run, every rank its own engine).
        tensor_parallel: GPUs per engine; a TP group never spans two nodes, so it
            must divide ``local_world``.
    """
    if world < 1 or local_world < 1 or world % local_world:
        raise PlacementError(
            f"world size {world} is not a whole number of nodes of {local_world} ranks "
            "(torchrun --nnodes N --nproc_per_node M gives world N x M)"
        )
    if tensor_parallel < 1:
        raise InvalidConfigError(f"tensor_parallel_size must be >= 1, got {tensor_parallel}")
    cpu = gpus_per_node == 0
    if cpu and tensor_parallel > 1:
        raise PlacementError(
            f"tensor_parallel_size={tensor_parallel} needs GPUs; this launch has none. Set "
            "rollout.engine_kwargs.tensor_parallel_size=1 on the CPU"
        )
    if local_world % tensor_parallel:
        raise PlacementError(
            f"tensor_parallel_size={tensor_parallel} does not divide the {local_world} ranks "
            f"of a node: an engine's shards must sit on one group of consecutive ranks' GPUs. "
            f"Use a divisor of {local_world}, or --nproc_per_node a multiple of {tensor_parallel}"
        )
    plan = []
    for rank in range(world):
        node, local = divmod(rank, local_world)
        first = local - local % tensor_parallel  # the group's first local rank
        leads = local == first
        engine = (node * local_world + first) // tensor_parallel if leads else None
        devices = () if cpu or not leads else tuple(range(first, first + tensor_parallel))
        plan.append(
            Placement(
                rank=rank,
                local_rank=local,
                node=node,
                train_device=None if cpu else local,
                engine=engine,
                engine_devices=devices,
                leader=node * local_world + first,
            )
        )
    check_placement(plan, gpus_per_node=gpus_per_node)
    return plan


def check_placement(plan: list[Placement], *, gpus_per_node: int) -> None:
    """Raise :class:`PlacementError` if two training ranks or two engine shards share a
    device of one node, or a device index is past the node's ``gpus_per_node``."""
    if gpus_per_node == 0:
        return
    training = Counter((p.node, p.train_device) for p in plan if p.train_device is not None)
    shards = Counter((p.node, d) for p in plan for d in p.engine_devices)
    for what, counts in (("training ranks", training), ("engine shards", shards)):
        for (node, device), n in counts.items():
            if n > 1:
                raise PlacementError(
                    f"{n} {what} on GPU {device} of node {node}: each GPU takes one training "
                    "rank and one engine shard. Check --nproc_per_node and "
                    "tensor_parallel_size against the node's GPUs"
                )
            if not 0 <= device < gpus_per_node:
                raise PlacementError(
                    f"{what} placed on GPU {device} of node {node}, which has "
                    f"{gpus_per_node} GPU(s): run at most {gpus_per_node} ranks per node"
                )


def engine_tensor_parallel(engine: str, engine_kwargs: Mapping[str, object]) -> int:
    """The GPUs one rollout engine spans (vLLM's ``tensor_parallel_size``; 1 otherwise)."""
    if engine != "vllm":
        return 1
    return int(engine_kwargs.get("tensor_parallel_size", 1) or 1)


def physical_devices(local: tuple[int, ...]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the local GPU indices ``local``, through the
    launch's own ``CUDA_VISIBLE_DEVICES`` mapping when it set one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v.strip() for v in visible.split(",")] if visible else None
    if names is not None and any(i >= len(names) for i in local):
        raise PlacementError(
            f"the engine needs local GPUs {list(local)} but CUDA_VISIBLE_DEVICES={visible!r} "
            f"lists {len(names)}"
        )
    return ",".join(names[i] if names is not None else str(i) for i in local)
