"""The HF engine's prefills (:mod:`vt_train.engines.hf`): new requests' prompts run
through the model together, as a left-padded batch; and the reuse of kept KV caches
(:class:`~vt_train.engines.prefix_cache.PrefixCache`): rows that continue kept prefixes,
whichever entries and however long, prefill only the rest of their prompts, together,
laid out as ``[padding | prefix | padding | rest]`` (the mask is 0 on both paddings, and
a row's own positions are always its unmasked ones); the prefix that requests admitted
together share is prefilled once; a finished row's keys and values are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..vision import rope_positions
from .hf_batch import _Batch, _capacity, _GrowingLayer, _hold, _right_aligned, _Row
from .prefix_cache import CachedPrefix

#: The shortest prefix shared by prompts admitted together that is prefilled once.
_MIN_SHARED_PREFIX = 16


def _common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading ids every prompt in ``prompts`` has in common."""
    first, length = prompts[0], min(len(p) for p in prompts)
    for prompt in prompts[1:]:
        n = 0
        while n < length and prompt[n] == first[n]:
            n += 1
        length = n
    return length


class _Prefills:
    """The :class:`~vt_train.engines.hf.HFEngine` methods that prefill prompts and keep
    or reuse prefixes' KV caches (a mixin: they read and set the engine's state)."""

    def _seed_shared_prefix(self, rows: list[_Row]) -> None:
        """Prefill once the prefix that the prompts of ``rows`` share and no kept
        entry covers, and keep it in the prefix cache.

        A GRPO step admits ``tasks x n`` first turns together; they share the
        system prompt and worked examples, and a group's ``n`` prompts are
        identical. Without this, each of them prefills that prefix again.
        """
        assert self._prefix is not None
        prompts = [row.request.prompt for row in rows]
        if len(prompts) < 2:
            return
        shared = _common_prefix_length(prompts)
        shared = min(shared, min(len(p) for p in prompts) - 1)  # a token left for logits
        hit = self._prefix.lookup(prompts[0])
        kept = min(hit[0], shared) if hit is not None else 0
        # Worth a forward only when the uncovered part is long: rows of one task that
        # continue the same kept entry (greedy samples of a group) share just the turn's
        # new tokens, which each prefills cheaply after the kept part anyway.
        if shared - kept < _MIN_SHARED_PREFIX:
            return
        ids = prompts[0][:shared]
        # Plain layers: they concatenate, so the kept entry's tensors are only read.
        cache = DynamicCache(config=self.model.config)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            return  # sliding windows keep only part of the sequence
        if kept and self.vision:
            return  # multimodal rotary positions are not a plain range past the kept part
        if kept:
            assert hit is not None
            for layer, (keys, values) in zip(cache.layers, hit[1].head(kept)):
                _hold(layer, keys, values, kept)
        inputs = torch.tensor([ids[kept:]], dtype=torch.long, device=self.device)
        positions = torch.arange(kept, shared, device=self.device).unsqueeze(0) if kept else None
        out = self.model(
            input_ids=inputs, position_ids=positions, past_key_values=cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        self.prefill_tokens += shared - kept
        self.cached_tokens += kept
        layers = out.past_key_values.layers
        self._prefix.store(ids, [(layer.keys, layer.values) for layer in layers])

    def _prefill(self, rows: list[_Row]) -> _Batch:
        """Prefill ``rows``' whole prompts together, as a batch."""
        input_ids, attention_mask = self._left_pad([row.request.prompt for row in rows])
        vision: dict[str, torch.Tensor] = {}
        if self.vision:
            images = [image for row in rows for image in row.request.images]
            vision = self._images(images, self.device) if images else {}
            position_ids = rope_positions(
                self.model.model, input_ids, attention_mask, vision.get("image_grid_thw")
            )
            next_position = position_ids.amax(dim=(0, 2)) + 1  # [B]: past every image's rows
        else:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            next_position = position_ids[:, -1] + 1
        return self._run_prefill(
            rows, attention_mask, next_position, sum(len(row.request.prompt) for row in rows),
            input_ids=input_ids, position_ids=position_ids, past_key_values=self._new_cache(),
            **vision,
        )  # fmt: skip

    def _run_prefill(
        self,
        rows: list[_Row],
        attention_mask: torch.Tensor,
        next_position: torch.Tensor,
        tokens: int,
        **inputs: Any,
    ) -> _Batch:
        """One prefill forward of ``tokens`` new tokens for ``rows``, as a batch."""
        out = self.model(attention_mask=attention_mask, use_cache=True, logits_to_keep=1, **inputs)
        self.num_batches += 1
        self.batch_sizes.append(len(rows))
        self.prefill_tokens += tokens
        return _Batch(
            rows, out.past_key_values, attention_mask, next_position, out.logits[:, -1].float()
        )

    def _new_cache(self) -> DynamicCache:
        """An empty cache for the model: :class:`_GrowingLayer` layers when all of its
        layers are plain ``DynamicLayer`` (no sliding window), else the model's own."""
        cache = DynamicCache(config=self.model.config)
        if all(type(layer) is DynamicLayer for layer in cache.layers):
            cache.layers = [_GrowingLayer() for _ in cache.layers]
        return cache

    def _prefill_after(self, hits: list[tuple[_Row, int, CachedPrefix]]) -> _Batch:
        """Prefill each ``(row, cached, entry)``'s prompt past its first ``cached``
        tokens, whose keys and values ``entry`` holds, all in one forward.

        Row ``i`` is laid out as ``[left padding | kept prefix | padding | rest]``: the
        kept prefixes are right-aligned in a cache as deep as the deepest one, the rests
        left-padded to the longest one; the mask is 0 on both paddings and the position
        ids count the row's own tokens (its rest starts at its ``cached``), so every row
        computes what it would alone, and a row's positions are its unmasked ones
        (:meth:`_keep_prefix` relies on it).
        """
        rows = [row for row, _, _ in hits]
        rests = [row.request.prompt[cached:] for row, cached, _ in hits]
        depth = max(cached for _, cached, _ in hits)
        width = max(len(rest) for rest in rests)
        cache = self._new_cache()
        capacity = _capacity(depth + width)  # room for the rests and the decode steps
        for i, layer in enumerate(cache.layers):
            keys = _right_aligned([e.layers[i][0][:, :, :n] for _, n, e in hits], depth, capacity)
            values = _right_aligned([e.layers[i][1][:, :, :n] for _, n, e in hits], depth, capacity)
            _hold(layer, keys, values, depth)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), depth + width), dtype=torch.long)
        position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ((row, cached, _), rest) in enumerate(zip(hits, rests)):
            pad = width - len(rest)
            ids[i, pad:] = torch.tensor(rest, dtype=torch.long)
            attention_mask[i, depth - cached : depth] = 1
            attention_mask[i, depth + pad :] = 1
            position_ids[i, pad:] = torch.arange(cached, cached + len(rest))
            row.cached = cached
            self.cached_tokens += cached
        next_position = torch.tensor([len(row.request.prompt) for row in rows], device=self.device)
        return self._run_prefill(
            rows, attention_mask.to(self.device), next_position, sum(map(len, rests)),
            input_ids=ids.to(self.device), position_ids=position_ids.to(self.device),
            past_key_values=cache,
        )  # fmt: skip

    def _keep_prefix(self, batch: _Batch, i: int) -> None:
        """Keep finished row ``i``'s keys and values (its prompt and every generated
        token but the last, the one never fed) in the prefix cache."""
        row = batch.rows[i]
        ids = row.request.prompt + row.token_ids[:-1]
        layers = batch.cache.layers
        if any(type(layer) not in (DynamicLayer, _GrowingLayer) for layer in layers):
            self._prefix = None  # sliding windows keep only part of the sequence
            return
        # The row's positions are its unmasked ones: padding sits on the left and, for
        # rows that continued a kept prefix together, between that prefix and the rest.
        where = torch.nonzero(batch.attention_mask[i]).flatten()[-len(ids) :]
        if len(where) != len(ids):
            return
        kept = [(la.keys[i : i + 1, :, where], la.values[i : i + 1, :, where]) for la in layers]
        self._prefix.store(ids, kept)

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        pad, device = self.tokenizer.pad_token_id, self.device
        ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long, device=device)
            mask[i, width - len(prompt) :] = 1
        return ids, mask
