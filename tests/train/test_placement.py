"""Where ranks train and engines run: one training rank and one engine shard per GPU.

The plans are built for simulated launches (no GPU needed): the issue's case, 8 ranks
with tensor parallelism 2, where every rank once built its own two-GPU engine and all
of them landed on GPU 0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from vt_envs.errors import InvalidConfigError
from vt_train.placement import (
    PlacementError,
    check_placement,
    engine_tensor_parallel,
    physical_devices,
    plan_placement,
)


def test_eight_ranks_with_tensor_parallel_two_get_four_engines_on_disjoint_gpus():
    plan = plan_placement(world=8, local_world=8, gpus_per_node=8, tensor_parallel=2)
    assert [p.train_device for p in plan] == list(range(8))
    leaders = [p for p in plan if p.leads]
    assert [p.rank for p in leaders] == [0, 2, 4, 6]
    assert [p.engine for p in leaders] == [0, 1, 2, 3]
    assert [p.engine_devices for p in leaders] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [p.leader for p in plan] == [0, 0, 2, 2, 4, 4, 6, 6]
    assert all(p.engine_devices == () for p in plan if not p.leads)
    shards = sorted(d for p in plan for d in p.engine_devices)
    assert shards == list(range(8))  # every GPU holds exactly one engine shard


def test_two_nodes_keep_each_engine_inside_one_node():
    plan = plan_placement(world=16, local_world=8, gpus_per_node=8, tensor_parallel=4)
    leaders = [p for p in plan if p.leads]
    assert [(p.rank, p.node, p.engine, p.engine_devices) for p in leaders] == [
        (0, 0, 0, (0, 1, 2, 3)),
        (4, 0, 1, (4, 5, 6, 7)),
        (8, 1, 2, (0, 1, 2, 3)),
        (12, 1, 3, (4, 5, 6, 7)),
    ]
    assert [p.local_rank for p in plan[8:]] == list(range(8))


def test_every_rank_leads_its_own_engine_without_tensor_parallelism_and_on_the_cpu():
    gpu = plan_placement(world=4, local_world=4, gpus_per_node=4)
    assert [(p.engine, p.engine_devices) for p in gpu] == [(i, (i,)) for i in range(4)]
    cpu = plan_placement(world=2, local_world=2, gpus_per_node=0)
    assert [(p.engine, p.train_device, p.engine_devices) for p in cpu] == [
        (0, None, ()),
        (1, None, ()),
    ]


@pytest.mark.parametrize(
    "launch, message",
    [
        (dict(world=8, local_world=8, gpus_per_node=8, tensor_parallel=3), "does not divide"),
        (dict(world=8, local_world=8, gpus_per_node=4), "which has 4 GPU"),
        (dict(world=6, local_world=4, gpus_per_node=4), "not a whole number of nodes"),
        (dict(world=2, local_world=2, gpus_per_node=0, tensor_parallel=2), "needs GPUs"),
    ],
)
def test_launches_that_cannot_be_placed_are_refused(launch, message):
    with pytest.raises(PlacementError, match=message):
        plan_placement(**launch)


def test_overlapping_engines_are_refused():
    """What happened before placement: each of 8 ranks started its own TP-2 engine, and
    with nothing choosing devices, all of them on GPUs 0 and 1."""
    plan = plan_placement(world=8, local_world=8, gpus_per_node=8, tensor_parallel=1)
    before = [replace(p, engine=p.rank, engine_devices=(0, 1)) for p in plan]
    with pytest.raises(PlacementError, match="8 engine shards on GPU 0 of node 0"):
        check_placement(before, gpus_per_node=8)
    shared = [replace(p, train_device=0) for p in plan]
    with pytest.raises(PlacementError, match="8 training ranks on GPU 0"):
        check_placement(shared, gpus_per_node=8)


def test_engine_devices_follow_the_launchs_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert physical_devices((2, 3)) == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert physical_devices((2, 3)) == "6,7"
    with pytest.raises(PlacementError, match="lists 4"):
        physical_devices((3, 4))


def test_tensor_parallel_size_is_read_from_the_vllm_engine_only():
    assert engine_tensor_parallel("vllm", {"tensor_parallel_size": 2}) == 2
    assert engine_tensor_parallel("vllm", {}) == 1
    assert engine_tensor_parallel("hf", {"tensor_parallel_size": 2}) == 1
    with pytest.raises(InvalidConfigError):
        plan_placement(world=1, local_world=1, gpus_per_node=1, tensor_parallel=0)
