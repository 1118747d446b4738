"""TrainBatch: padding, alignment, normalizers across minibatches and micro-batches."""

from __future__ import annotations

import pytest
import torch

from vt_envs.errors import InvalidConfigError
from vt_train.batch import TrainBatch
from vt_train.trajectory import Trajectory

PAD = 0


def traj(ids: list[int], mask: list[int], reward: float, group: int) -> Trajectory:
    logprobs = [-0.1 * i if m else 0.0 for i, m in zip(ids, mask)]
    return Trajectory(
        task_id=f"t{group}",
        group_id=group,
        input_ids=ids,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        prompt_length=mask.index(1) if 1 in mask else len(mask),
        reward=reward,
    )


@pytest.fixture
def trajectories() -> list[Trajectory]:
    return [
        traj([5, 6, 7, 8, 9], [0, 0, 1, 1, 0], 1.0, 0),
        traj([5, 6, 3], [0, 0, 1], 0.0, 0),
        traj([4, 4, 4, 4, 4, 4, 4], [0, 1, 1, 1, 0, 1, 1], 0.5, 1),
        traj([1, 2], [0, 1], 0.0, 1),
    ]


def test_from_trajectories_pads_right_and_keeps_alignment(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD)
    assert batch.input_ids.shape == (4, 7) and len(batch) == 4
    assert batch.input_ids[1].tolist() == [5, 6, 3, PAD, PAD, PAD, PAD]
    assert batch.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert batch.loss_mask[0].tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx([0, 0, -0.7, -0.8, 0, 0, 0])
    assert batch.lengths.tolist() == [5, 3, 7, 2]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5, 0.0]
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert (batch.num_tokens, batch.num_sequences) == (2 + 1 + 5 + 1, 4)
    assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.float32


def test_pad_to_multiple_of(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD, pad_to_multiple_of=8)
    assert batch.max_length == 8


def token_mean_loss(batch: TrainBatch, per_token: torch.Tensor) -> torch.Tensor:
    """A token-mean loss normalized by the minibatch's global token count."""
    return (per_token * batch.loss_mask).sum() / batch.num_tokens


def test_split_keeps_the_minibatch_normalizers(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD)
    values = torch.arange(batch.input_ids.numel(), dtype=torch.float32).view_as(batch.loss_mask)
    batch = batch.with_extras(values=values)
    full = token_mean_loss(batch, batch.extras["values"])

    micro = batch.split(3)
    assert [len(m) for m in micro] == [3, 1]
    assert all((m.num_tokens, m.num_sequences) == (9, 4) for m in micro)
    # Micro-batches are trimmed to their own longest row.
    assert [m.max_length for m in micro] == [7, 2]
    accumulated = sum(token_mean_loss(m, m.extras["values"]) for m in micro)
    assert accumulated.item() == pytest.approx(full.item())


def test_minibatches_have_their_own_normalizers_and_shuffle_reproducibly(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD)
    mbs = list(batch.minibatches(2))
    assert [mb.group_ids.tolist() for mb in mbs] == [[0, 0], [1, 1]]
    assert [(mb.num_tokens, mb.num_sequences) for mb in mbs] == [(3, 2), (6, 2)]

    def order(seed: int) -> list[float]:
        g = torch.Generator().manual_seed(seed)
        return [
            r for mb in batch.minibatches(2, shuffle=True, generator=g) for r in mb.lengths.tolist()
        ]

    assert order(0) == order(0)
    assert sorted(order(0)) == sorted(batch.lengths.tolist())
    assert any(order(s) != batch.lengths.tolist() for s in range(5))


def test_rows_stay_intact_when_selected(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD)
    picked = batch.select([2, 0], normalize=True)
    assert picked.input_ids[1, :5].tolist() == [5, 6, 7, 8, 9]
    assert picked.loss_mask[0].tolist() == [0, 1, 1, 1, 0, 1, 1]
    assert picked.rewards.tolist() == [0.5, 1.0]
    assert picked.num_tokens == 7


def test_extras_must_fit_the_batch(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD)
    with pytest.raises(InvalidConfigError, match="expected"):
        batch.with_extras(advantages=torch.zeros(3))
    with pytest.raises(InvalidConfigError, match="expected"):
        batch.with_extras(advantages=torch.zeros(4, 5))
    per_row = batch.with_extras(advantages=torch.arange(4.0))
    assert per_row.split(2)[1].extras["advantages"].tolist() == [2.0, 3.0]


def test_bad_sizes_raise(trajectories):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=PAD)
    with pytest.raises(InvalidConfigError, match="micro_batch_size"):
        batch.split(0)
    with pytest.raises(InvalidConfigError, match="size"):
        list(batch.minibatches(0))
    with pytest.raises(InvalidConfigError, match="at least one"):
        TrainBatch.from_trajectories([], pad_token_id=PAD)
