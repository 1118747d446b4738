"""The HF engine's running batch and its KV cache (:mod:`vt_train.engines.hf`).

A request (:class:`_Request`) becomes a row (:class:`_Row`, its sampling state) of the
running :class:`_Batch`, which holds every row's KV cache, attention mask, next position
and last logits. The cache uses left padding: pad ids on the left, attention mask 0
there, and position ids that count real tokens only; when batches of different lengths
are merged (:meth:`_Batch.concat`), the shorter side's cache is padded on the left. The
cache grows in place (:class:`_GrowingLayer`): a decode step writes its keys and values
into room left past the cache instead of copying the whole cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from .base import FinishReason, Generation, SamplingParams, StopChecker


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    images: tuple[Any, ...] = ()
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class _Row:
    """The sampling state of one request inside a batch."""

    request: _Request
    stop: StopChecker
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    admitted_at: float = 0.0
    batch_size: int = 0
    cached: int = 0  # prompt tokens whose keys and values came from the prefix cache


@dataclass
class _Batch:
    """The running batch: its rows, KV cache, masks, next positions and last logits."""

    rows: list[_Row]
    cache: Any
    attention_mask: torch.Tensor  # [B, T], 0 on left padding
    next_position: torch.Tensor  # [B], each row's next position id
    logits: torch.Tensor  # [B, V], the logits to sample the next tokens from

    def select(self, keep: list[int]) -> _Batch:
        index = torch.tensor(keep, device=self.attention_mask.device)
        self.cache.batch_select_indices(index)
        return _Batch(
            [self.rows[i] for i in keep], self.cache, self.attention_mask[index],
            self.next_position[index], self.logits[index],
        )  # fmt: skip

    @staticmethod
    def concat(batches: Sequence[_Batch]) -> _Batch:
        """One batch of all of ``batches`` (in order), in one copy: the shorter ones'
        caches and masks are padded on the left, the caches written into buffers with
        room to grow (:class:`_GrowingLayer`). The first one's cache object is reused."""
        if len(batches) == 1:
            return batches[0]
        width = max(b.attention_mask.shape[1] for b in batches)
        first = batches[0].cache
        for i, layer in enumerate(first.layers):
            parts = [b.cache.layers[i] for b in batches]
            capacity = _capacity(width) if isinstance(layer, _GrowingLayer) else width
            keys = _right_aligned([part.keys for part in parts], width, capacity)
            values = _right_aligned([part.values for part in parts], width, capacity)
            _hold(layer, keys, values, width)
        return _Batch(
            [row for b in batches for row in b.rows],
            first,
            torch.cat([_left(b.attention_mask, width) for b in batches]),
            torch.cat([b.next_position for b in batches]),
            torch.cat([b.logits for b in batches]),
        )


class _GrowingLayer(DynamicLayer):
    """A :class:`DynamicLayer` that appends in place.

    ``keys`` and ``values`` are views of the leading positions of buffers (``room``,
    ``[B, heads, capacity, dim]``) with space past them: :meth:`update` writes the
    new positions there. ``DynamicLayer`` concatenates instead, copying the whole
    cache at every decode step of every layer. When the room is full, or
    ``keys``/``values`` were replaced by other tensors (``DynamicLayer``'s crop and
    reset, a caller's assignment), the next update copies them into new buffers a
    quarter larger than needed. The values are the same either way.
    """

    def __init__(self) -> None:
        super().__init__()
        self.room: tuple[torch.Tensor, torch.Tensor] | None = None

    def hold(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Cache the first ``length`` positions of ``keys`` and ``values``; the layer
        owns both buffers from now on (it writes past ``length`` in place)."""
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.room = (keys, values)
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._room_holds(end):
            keys = key_states.new_empty(
                (*key_states.shape[:2], _capacity(end), key_states.shape[3])
            )
            values = value_states.new_empty((*keys.shape[:3], value_states.shape[3]))
            if length:
                keys[:, :, :length], values[:, :, :length] = self.keys, self.values
            self.room = (keys, values)
        keys, values = self.room
        keys[:, :, length:end], values[:, :, length:end] = key_states, value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``, with their room (one copy, none at the next update)."""
        if self.room is None or not self._room_holds(self.get_seq_length()):
            super().batch_select_indices(indices)
            return
        keys, values = self.room
        self.hold(keys[indices], values[indices], self.get_seq_length())

    def _room_holds(self, end: int) -> bool:
        """Whether ``keys``/``values`` are still the leading positions of ``room`` and
        it has ``end`` positions."""
        if self.room is None or self.room[0].shape[2] < end:
            return False
        return all(
            view.data_ptr() == buffer.data_ptr() and view.stride() == buffer.stride()
            and view.shape[:2] == buffer.shape[:2]
            for view, buffer in zip((self.keys, self.values), self.room)
        )  # fmt: skip


def _capacity(length: int) -> int:
    """Positions to allocate for a cache of ``length``: a quarter more (at least 32),
    so a long generation copies its cache O(log length) times, not once a token."""
    return length + max(length // 4, 32)


def _hold(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
    """Make ``layer`` cache the first ``length`` positions of ``keys`` and ``values``."""
    if isinstance(layer, _GrowingLayer):
        layer.hold(keys, values, length)
    else:
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]


def _left(mask: torch.Tensor, width: int) -> torch.Tensor:
    """An attention mask ``[B, T]`` zero-padded on the left up to ``width``."""
    missing = width - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def _right_aligned(
    tensors: Sequence[torch.Tensor], width: int, capacity: int | None = None
) -> torch.Tensor:
    """``tensors`` (``[b_i, heads, t_i, dim]``) stacked on the batch dimension in one
    new buffer ``[sum b_i, heads, capacity, dim]`` (default ``width``), each ending at
    position ``width`` with zeros on its left; positions past ``width`` are unset."""
    first = tensors[0]
    rows = sum(t.shape[0] for t in tensors)
    out = first.new_empty((rows, first.shape[1], capacity or width, first.shape[3]))
    start = 0
    for t in tensors:
        stop, pad = start + t.shape[0], width - t.shape[2]
        out[start:stop, :, :pad] = 0
        out[start:stop, :, pad:width] = t
        start = stop
    return out
