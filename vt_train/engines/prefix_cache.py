"""A bounded LRU of KV caches keyed by the token ids they were computed from.

A multi-turn episode sends the HF engine, at turn k, its prompt of turn k-1,
what the model generated then, and what the env appended since. The engine
keeps each finished request's KV cache here (the keys and values of every
token it has fed through the model: the prompt and all generated tokens but
the last), so turn k prefills only the tokens past the longest common prefix
with a kept entry. An entry matches as far as its ids agree with the new
prompt: a turn whose action the env cut or rewrote still reuses the part
before the change.

Memory is bounded by ``max_bytes`` (keys and values of every layer, counted
exactly); the least recently used entries go first. The engine clears the
cache when its weights change: a KV cache belongs to the weights that made it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["CachedPrefix", "PrefixCache"]


@dataclass
class CachedPrefix:
    """Keys and values (per layer, ``[1, heads, tokens, head_dim]``) of ``ids``."""

    ids: np.ndarray
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    def head(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The keys and values of the first ``length`` tokens."""
        return [(k[:, :, :length], v[:, :, :length]) for k, v in self.layers]


class PrefixCache:
    """An LRU of :class:`CachedPrefix` entries, at most ``max_bytes`` in all."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self._keys = itertools.count()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``layers`` (copied: never views of a batch's cache) as the KV of ``ids``."""
        if not ids or self.max_bytes <= 0:
            return
        entry = CachedPrefix(
            np.asarray(ids, dtype=np.int64), [(k.clone(), v.clone()) for k, v in layers]
        )
        if entry.nbytes > self.max_bytes:
            return
        # An entry that is a prefix of the new one says nothing the new one does not.
        for key, kept in list(self._entries.items()):
            if len(kept.ids) <= len(entry.ids) and np.array_equal(
                kept.ids, entry.ids[: len(kept.ids)]
            ):
                self._drop(key)
        self._entries[next(self._keys)] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def lookup(self, prompt: list[int]) -> tuple[int, CachedPrefix] | None:
        """The entry sharing the longest prefix with ``prompt`` and that length, or
        ``None`` when none shares a token. The length is below ``len(prompt)``: at
        least one token is left to prefill (its logits start the generation)."""
        if not self._entries:
            self.misses += 1
            return None
        ids = np.asarray(prompt, dtype=np.int64)
        best_key, best_length = None, 0
        for key, entry in self._entries.items():
            n = min(len(entry.ids), len(ids) - 1)
            if n <= best_length:
                continue
            differs = np.flatnonzero(entry.ids[:n] != ids[:n])
            length = int(differs[0]) if differs.size else n
            if length > best_length:
                best_key, best_length = key, length
        if best_key is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(best_key)
        return best_length, self._entries[best_key]

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes
