"""Trajectories → padded tensors, and the minibatch / micro-batch views of them.

Per-token tensors are ``[B, L]``, right-padded, and aligned to tokens: index
``t`` describes token ``t`` (its logprob comes from the logits at ``t - 1``).

Normalizers: a loss aggregated over a minibatch (token-mean, seq-mean) must
divide by the minibatch's totals even when the minibatch is split into
micro-batches for gradient accumulation, or the accumulated gradient differs
from the full-batch one. So every :class:`TrainBatch` carries ``num_tokens``
(loss-mask tokens) and ``num_sequences`` of the *minibatch it belongs to*:
:meth:`TrainBatch.minibatches` recomputes them for each minibatch, and
:meth:`TrainBatch.split` keeps them in every micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vt_envs.errors import InvalidConfigError
from vt_train.trajectory import Trajectory

__all__ = ["TrainBatch"]

# Every tensor field has the batch dimension first.
_TENSORS = (
    *("input_ids", "attention_mask", "loss_mask", "rollout_logprobs"),
    *("rewards", "group_ids", "lengths"),
)


@dataclass
class TrainBatch:
    """A batch of trajectories as tensors.

    Attributes:
        input_ids: ``[B, L]`` int64, right-padded with the pad id.
        attention_mask: ``[B, L]`` int64, 1 on real tokens.
        loss_mask: ``[B, L]`` float32, 1 on policy-generated tokens.
        rollout_logprobs: ``[B, L]`` float32, the engine's logprobs (0 off the mask).
        rewards: ``[B]`` float32, episode rewards.
        group_ids: ``[B]`` int64, same value for samples of the same task.
        lengths: ``[B]`` int64, real tokens per row.
        num_tokens: loss-mask tokens of the whole minibatch this batch is part
            of (a micro-batch keeps its minibatch's value).
        num_sequences: rows of that whole minibatch.
        extras: further per-row (``[B]``) or per-token (``[B, L]``) tensors the
            algorithm attaches (advantages, returns, old / reference logprobs,
            values); they are indexed, split and moved with the rest.
        images: per row, the trajectory's images in token order (the arrays
            themselves, by reference), or ``None`` when no row has any. Rows
            are selected and split with the tensors; pixel values are made
            from them per forward (:class:`vt_train.vision.ImageInputs`) and
            never stored, so the batch holds each image once.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    lengths: torch.Tensor
    num_tokens: int
    num_sequences: int
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    images: list[tuple[Any, ...]] | None = None

    # ------------------------------------------------------------ building

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        *,
        pad_token_id: int,
        pad_to_multiple_of: int = 1,
    ) -> TrainBatch:
        """Stack trajectories into right-padded tensors.

        Args:
            trajectories: at least one.
            pad_token_id: fills ``input_ids`` past each row's length (the
                tokenizer's ``pad_token_id``); padding has attention and loss
                mask 0, so its value never matters to the loss.
            pad_to_multiple_of: round ``L`` up (kernels like multiples of 8).
        """
        if not trajectories:
            raise InvalidConfigError("TrainBatch.from_trajectories needs at least one trajectory")
        if pad_to_multiple_of < 1:
            raise InvalidConfigError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        lengths = [len(t.input_ids) for t in trajectories]
        width = max(max(lengths), 1)
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        b = len(trajectories)
        cpu = torch.device("cpu")  # built on the host; the trainer moves it (TrainBatch.to)
        input_ids = torch.full((b, width), pad_token_id, dtype=torch.long, device=cpu)
        attention_mask = torch.zeros((b, width), dtype=torch.long, device=cpu)
        loss_mask = torch.zeros((b, width), dtype=torch.float32, device=cpu)
        logprobs = torch.zeros((b, width), dtype=torch.float32, device=cpu)
        for row, (traj, n) in enumerate(zip(trajectories, lengths)):
            input_ids[row, :n] = torch.tensor(traj.input_ids, dtype=torch.long, device=cpu)
            attention_mask[row, :n] = 1
            loss_mask[row, :n] = torch.tensor(traj.loss_mask, dtype=torch.float32, device=cpu)
            logprobs[row, :n] = torch.tensor(traj.rollout_logprobs, dtype=torch.float32, device=cpu)
        rewards = [t.reward for t in trajectories]
        group_ids = [t.group_id for t in trajectories]
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            rollout_logprobs=logprobs,
            rewards=torch.tensor(rewards, dtype=torch.float32, device=cpu),
            group_ids=torch.tensor(group_ids, dtype=torch.long, device=cpu),
            lengths=torch.tensor(lengths, dtype=torch.long, device=cpu),
            num_tokens=int(loss_mask.sum().item()),
            num_sequences=b,
            images=[tuple(t.images) for t in trajectories]
            if any(t.images for t in trajectories)
            else None,
        )

    # ------------------------------------------------------------- views

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_length(self) -> int:
        """``L``, the padded width."""
        return int(self.input_ids.shape[1])

    def with_extras(self, **tensors: torch.Tensor) -> TrainBatch:
        """A copy with more per-row ``[B]`` or per-token ``[B, L]`` tensors attached."""
        for name, tensor in tensors.items():
            if tensor.shape[0] != len(self) or (
                tensor.dim() >= 2 and tensor.shape[1] != self.max_length
            ):
                raise InvalidConfigError(
                    f"extra {name!r} has shape {tuple(tensor.shape)}; expected [{len(self)}] "
                    f"or [{len(self)}, {self.max_length}]"
                )
        return replace(self, extras={**self.extras, **tensors})

    def select(
        self, rows: torch.Tensor | Sequence[int], *, normalize: bool, trim: bool = True
    ) -> TrainBatch:
        """The rows ``rows``, trimmed to their longest length.

        ``normalize=True`` makes them a new minibatch (their own ``num_tokens``
        / ``num_sequences``); ``False`` keeps this batch's (a micro-batch).
        """
        index = torch.as_tensor(rows, dtype=torch.long, device=self.lengths.device)
        width = max(int(self.lengths[index].max().item()), 1) if len(index) else 1
        if not trim:
            width = self.max_length
        picked = {name: self._take(getattr(self, name), index, width) for name in _TENSORS}
        extras = {name: self._take(t, index, width) for name, t in self.extras.items()}
        images = None if self.images is None else [self.images[i] for i in index.tolist()]
        batch = replace(self, **picked, extras=extras, images=images)
        if normalize:
            batch.num_tokens = int(batch.loss_mask.sum().item())
            batch.num_sequences = len(index)
        return batch

    def _take(self, tensor: torch.Tensor, index: torch.Tensor, width: int) -> torch.Tensor:
        taken = tensor[index.to(tensor.device)]
        if taken.dim() >= 2 and tensor.shape[1] == self.max_length:  # per-token: trim padding
            taken = taken[:, :width]
        return taken

    def split(self, micro_batch_size: int, *, trim: bool = True) -> list[TrainBatch]:
        """Consecutive micro-batches of ``micro_batch_size`` rows (the last may
        be smaller) for gradient accumulation; each keeps this batch's
        ``num_tokens`` and ``num_sequences``, so losses divided by them sum to
        the full-batch loss."""
        _check_size("micro_batch_size", micro_batch_size)
        return [
            self.select(
                range(start, min(start + micro_batch_size, len(self))), normalize=False, trim=trim
            )
            for start in range(0, len(self), micro_batch_size)
        ]

    def minibatches(
        self,
        size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
    ) -> Iterator[TrainBatch]:
        """Minibatches of ``size`` rows (the last may be smaller), one per
        optimizer step, each with its own normalizers. ``shuffle`` permutes
        rows first with ``generator`` (seed it for reproducible epochs)."""
        _check_size("size", size)
        cpu = torch.device("cpu")  # the generator is a CPU one
        order = (
            torch.randperm(len(self), generator=generator, device=cpu)
            if shuffle
            else torch.arange(len(self), device=cpu)
        )
        for start in range(0, len(self), size):
            yield self.select(order[start : start + size], normalize=True)

    def to(self, device: torch.device | str) -> TrainBatch:
        """A copy on ``device``."""
        moved = {name: getattr(self, name).to(device) for name in _TENSORS}
        return replace(self, **moved, extras={k: v.to(device) for k, v in self.extras.items()})

    def row_images(self) -> list[Any]:
        """Every row's images, row by row, in token order (what one forward of this
        batch needs, in the order the model replaces the image-pad ids)."""
        return [image for row in self.images or () for image in row]

    def summary(self) -> Mapping[str, Any]:
        """Shapes and normalizers, for logs and error messages."""
        shapes = {name: tuple(getattr(self, name).shape) for name in _TENSORS}
        images = sum(len(row) for row in self.images) if self.images else 0
        return {
            **shapes,
            "num_tokens": self.num_tokens,
            "num_sequences": self.num_sequences,
            "images": images,
        }


def _check_size(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise InvalidConfigError(f"{name} must be an int >= 1, got {value!r}")
