"""The trainer's forwards, the same on every rank: logprobs, values, dummies, shards.

Every model call of a training step goes through :class:`Forwards`, which
keeps the ranks in step (:mod:`vt_train.lockstep`):

- **images**: with a vision-language policy on several ranks, the vision
  tower runs in every forward of every rank or in none. A forward whose rows
  hold no image while some other rank's do gets a dummy row with one small
  black image appended; its outputs are dropped but kept in the graph at
  zero weight, so its backward visits the tower too.
- **empty ranks**: a rank with fewer rows than another runs dummy passes
  (:meth:`Forwards.dummy_rows`), the same module calls on a two-token row.
- **scoring before the update** (old and reference logprobs, critic values,
  :meth:`Forwards.score_rows`): each rank scores its own rows (``rank::world``)
  in micro-batches trimmed to their own longest row, runs dummy passes up to
  the largest rank's count, and the results are all-gathered. Nothing is
  computed twice, and no row is padded to the batch's longest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vt_train.batch import TrainBatch
from vt_train.lockstep import Lockstep
from vt_train.model import state_values

__all__ = ["Forwards", "Scorers"]


@dataclass
class Scorers:
    """What :meth:`Forwards.score_rows` runs on each row: the actor (old logprobs,
    when recomputed), the frozen reference (KL) and the critic (values); ``None``
    skips one."""

    actor: Any = None
    reference: Any = None
    critic: Any = None

    def names(self) -> list[str]:
        wanted = (("old_logprobs", self.actor), ("ref_logprobs", self.reference))
        return [n for n, m in (*wanted, ("old_values", self.critic)) if m is not None]


class Forwards:
    """Runs the trainer's models on token rows, identically on every rank.

    Args:
        device: where the models are (inputs go there).
        lockstep: the agreement shared with the policy's :class:`LogprobModel`
            (enabled on several ranks).
        rank, world: this process's rank and the number of ranks.
        temperature: logprobs are of ``softmax(logits / temperature)``.
        pad_token_id: fills padding and dummy rows.
        image_inputs: a vision-language policy's
            :class:`~vt_train.vision.ImageInputs` (``None``: a text policy).
        vision_config: that policy's config (vision start / image pad / vision
            end ids) for its dummy rows.
    """

    def __init__(
        self,
        *,
        device: torch.device,
        lockstep: Lockstep,
        rank: int = 0,
        world: int = 1,
        temperature: float = 1.0,
        pad_token_id: int = 0,
        image_inputs: Any = None,
        vision_config: Any = None,
    ):
        self.device = device
        self.lockstep = lockstep
        self.rank, self.world = rank, world
        self.temperature = temperature
        self.pad = pad_token_id
        self.image_inputs = image_inputs
        self.vision_config = vision_config

    @property
    def vision(self) -> bool:
        return self.image_inputs is not None

    # ----------------------------------------------------------- one forward

    def pixels(self, images: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Pixel values and grids of ``images`` on the device (for one forward only)."""
        if self.image_inputs is None or not images:
            return {}
        return self.image_inputs(images, self.device)

    def logprobs(
        self,
        model: Any,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor | None,
        images: Sequence[Any] = (),
        *,
        entropy: bool = False,
        temperature: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``model``'s logprobs (and entropy) of ``ids`` at ``positions``, ``[B, L]``
        (``model``: a :class:`~vt_train.logprobs.LogprobModel`, maybe in DeepSpeed), at
        ``temperature`` (default: the trainer's)."""
        shape = ids.shape
        ids, mask, positions, pixels = self._inputs(ids, mask, positions, images)
        scale = self.temperature if temperature is None else temperature
        out, ent = model(
            ids, mask, positions=positions, temperature=scale, entropy=entropy, **pixels
        )
        return _real(out, shape), None if ent is None else _real(ent, shape)

    def values(
        self, critic: Any, ids: torch.Tensor, mask: torch.Tensor, images: Sequence[Any] = ()
    ) -> torch.Tensor:
        """The critic's ``V(s_t)`` of every token of ``ids``, ``[B, L]``."""
        shape = ids.shape
        ids, mask, _, pixels = self._inputs(ids, mask, None, images)
        return _real(state_values(critic, ids, mask, **pixels), shape)

    def dummy_rows(self) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
        """``(ids, positions, images)`` of one short row for the passes of a rank that
        has no rows left: two pads; a vision-language policy's holds one small black
        image (so its vision tower runs) and then a pad. ``positions`` selects only the
        last token, never a vision id (whose logprob is ``-inf``: the policy may not
        produce them), so every output of the row is finite."""
        if not self.vision:
            ids = [self.pad, self.pad]
            images: list[Any] = []
        else:
            image = np.zeros((56, 56, 3), dtype=np.uint8)
            c = self.vision_config
            pads = [c.image_token_id] * self.image_inputs.tokens(image)
            ids = [self.pad, c.vision_start_token_id, *pads, c.vision_end_token_id, self.pad]
            images = [image]
        row = torch.tensor([ids], device=self.device)
        positions = torch.zeros_like(row)
        positions[0, -1] = 1
        return row, positions, images

    def _inputs(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor | None,
        images: Sequence[Any],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        pixels = self.pixels(images)
        if not (self.vision and self.lockstep.enabled):
            return ids, mask, positions, pixels
        _, _, (somewhere,) = self.lockstep.agree(self.device, any_of=[bool(pixels)])
        if pixels or not somewhere:
            return ids, mask, positions, pixels
        # Another rank runs the vision tower in this forward: so must this one.
        dummy, dummy_positions, dummy_images = self.dummy_rows()
        width = max(ids.shape[1], dummy.shape[1])
        ids = torch.cat([_right(ids, width, self.pad), _right(dummy, width, self.pad)])
        ones = torch.ones_like(dummy)
        mask = torch.cat([_right(mask, width, 0), _right(ones.to(mask.dtype), width, 0)])
        if positions is not None:
            extra = _right(dummy_positions.to(positions.dtype), width, 0)
            positions = torch.cat([_right(positions, width, 0), extra])
        return ids, mask, positions, self.pixels(dummy_images)

    # -------------------------------------------------------- scoring shards

    @torch.no_grad()
    def score_rows(
        self, batch: TrainBatch, scorers: Scorers, micro_batch_size: int
    ) -> dict[str, torch.Tensor]:
        """``{"old_logprobs", "ref_logprobs", "old_values"}`` (those ``scorers`` has) of
        every row of ``batch`` (on the device), ``[B, L]``: this rank scores rows
        ``rank::world`` and the ranks all-gather. Logprobs are taken at the loss mask."""
        names = scorers.names()
        if not names:
            return {}
        rows, width = len(batch), batch.max_length
        mine = batch.select(range(self.rank, rows, self.world), normalize=False)
        micro = mine.split(micro_batch_size) if len(mine) else []
        per_rank = -(-rows // self.world)  # the busiest rank's rows, and its passes
        passes = -(-per_rank // micro_batch_size)
        parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        for i in range(passes):
            if i < len(micro):
                mb = micro[i]
                ids, mask, positions, images = (
                    mb.input_ids, mb.attention_mask, mb.loss_mask, mb.row_images(),
                )  # fmt: skip
            else:
                ids, positions, images = self.dummy_rows()
                mask = torch.ones_like(ids)
            out = self._score(scorers, ids, mask, positions, images)
            if i < len(micro):
                for name, tensor in out.items():
                    parts[name].append(_right(tensor.float(), width, 0.0))
        local = {
            name: torch.cat(chunks) if chunks else torch.zeros((0, width), device=self.device)
            for name, chunks in parts.items()
        }
        return self._gather_rows(local, rows)

    def _score(
        self,
        scorers: Scorers,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        images: Sequence[Any],
    ) -> dict[str, torch.Tensor]:
        out = {}
        if scorers.actor is not None:
            out["old_logprobs"] = self.logprobs(scorers.actor, ids, mask, positions, images)[0]
        if scorers.reference is not None:
            out["ref_logprobs"] = self.logprobs(scorers.reference, ids, mask, positions, images)[0]
        if scorers.critic is not None:
            out["old_values"] = self.values(scorers.critic, ids, mask, images)
        return out

    def _gather_rows(self, local: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        """Every rank's ``rank::world`` rows, back in batch order (one all-gather)."""
        if self.world == 1:
            return local
        import torch.distributed as dist

        names = sorted(local)
        per_rank = -(-rows // self.world)
        width = next(iter(local.values())).shape[1]
        stacked = torch.zeros((len(names), per_rank, width), device=self.device)
        for k, name in enumerate(names):
            stacked[k, : local[name].shape[0]] = local[name]
        shares = [torch.empty_like(stacked) for _ in range(self.world)]
        dist.all_gather(shares, stacked)
        out = {}
        for k, name in enumerate(names):
            order = [shares[j % self.world][k, j // self.world] for j in range(rows)]
            out[name] = torch.stack(order)
        return out


def _right(tensor: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """``tensor`` ``[B, l]`` padded on the right with ``value`` to ``[B, width]``."""
    missing = width - tensor.shape[1]
    if missing <= 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, missing), value=value)


def _real(out: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The caller's rows of ``out`` (``shape``); rows a dummy image appended are
    dropped from the values but kept in the graph at zero weight."""
    if out.shape == shape:
        return out
    rows, width = shape
    kept = out[:rows, :width]
    return kept + 0.0 * out[rows:].sum()
