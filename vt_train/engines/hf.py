"""A rollout engine over a Hugging Face ``transformers`` causal LM (CPU fallback, tests).

Continuous batching: requests are async and per trajectory, and one decode
loop (on a worker thread, so the event loop keeps stepping envs) serves them
all. Between two decode steps the loop admits whatever requests have arrived
(their prompts are prefilled together and their KV cache joins the running
batch's), and a row that finishes leaves the batch at once and resolves its
caller's future — a 1-token request never waits for a 400-token one, and a
trajectory whose tool call just returned never waits for the batch to drain.
The cache uses left padding: pad ids on the left, attention mask 0 there, and
position ids that count real tokens only, so a padded row computes what it
would alone; when rows of different lengths are merged, the shorter side's
cache is padded on the left. Rows that continue kept prefixes
(:class:`~vt_train.engines.prefix_cache.PrefixCache`), whichever entries and
however long, prefill together laid out as ``[padding | prefix | padding |
rest]``: the mask is 0 on both paddings, and a row's own positions are always
its unmasked ones. The KV cache grows in place (:class:`_GrowingLayer`): a
decode step writes its keys and values into room left past the cache instead
of copying the whole cache.

Every row samples independently: its own temperature, top-p, stop strings,
``max_new_tokens`` and, if it has a seed, its own ``torch.Generator``, so a
request samples the same tokens whatever else shares the batch.

Log-probabilities follow the engine protocol: ``log_softmax(logits / T)``
of the sampled token, before top-p truncation; greedy (``T == 0``) reports
``log_softmax(logits)`` of the argmax token.

Vision-language models (Qwen2-VL architecture): a request's images are
turned into pixel values by the processor's image processor when the
request is prefilled (:class:`~vt_train.vision.ImageInputs`), and the
rotary positions are the model's own 3-D ones for the left-padded prompt
(:func:`~vt_train.vision.rope_positions`); decoding continues each row from
its largest position + 1, as the model does. The vision token ids are never
sampled (their logits are ``-inf`` in the reported distribution too).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from vt_envs.core.packaged_models import resolve_model
from vt_envs.core.tokenizer import ChatTokenizer, load_tokenizer
from vt_envs.errors import InvalidConfigError

from ..attention import use_cpu_gqa_attention
from ..logprobs import ban_tokens
from ..vision import (
    ImageInputs,
    is_vision_language,
    load_policy,
    rope_positions,
    vision_token_ids,
)
from .base import (
    EngineClosedError,
    FinishReason,
    Generation,
    RolloutEngine,
    SamplingParams,
    StopChecker,
    reject_images,
)
from .prefix_cache import CachedPrefix, PrefixCache

__all__ = ["HFEngine"]


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


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, outcome: Any) -> None:
    """Settle ``future`` from the decode thread, on its own loop (unless cancelled)."""

    def settle() -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    loop.call_soon_threadsafe(settle)


class HFEngine(RolloutEngine):
    """Batched generation with a ``transformers`` causal LM.

    Args:
        model: a causal LM (``AutoModelForCausalLM`` instance) or the path of
            a local model directory (loaded with ``local_files_only=True``).
        tokenizer: anything :func:`vt_envs.core.tokenizer.load_tokenizer`
            accepts (``None``: the shipped default); used for eos and to
            decode tails for stop strings.
        max_batch_size: the most requests one batch serves.
        device: where the model runs.
        seed: seeds the engine RNG used by requests without a seed.
        processor: for a vision-language model, its processor directory (or
            image processor object); default: the model's own directory.
        prefix_cache_mb: memory for the KV caches of finished requests
            (:class:`~vt_train.engines.prefix_cache.PrefixCache`, LRU): a
            request that starts with the ids of one kept (a multi-turn
            episode's next turn) prefills only the rest, and requests admitted
            together prefill the prefix they share once (a GRPO step's
            ``tasks x n`` first turns behind one system prompt). ``0`` turns
            it off; vision-language and sliding-window models never use it.

    Attributes:
        num_batches: prefill groups admitted so far; ``batch_sizes`` lists their
            sizes (requests that arrived together join the batch together).
        prefill_tokens: prompt tokens run through the model so far;
            ``cached_tokens``: prompt tokens taken from the prefix cache instead.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 64,
        device: str | torch.device = "cpu",
        seed: int = 0,
        processor: Any = None,
        prefix_cache_mb: float = 256,
    ):
        if max_batch_size < 1:
            raise InvalidConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if isinstance(model, (str, os.PathLike)):
            model = resolve_model(str(model), dtype="float32")  # a packaged model's name
            processor = processor if processor is not None else model
            model = load_policy(model)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer: ChatTokenizer = load_tokenizer(tokenizer)
        self.vision = is_vision_language(self.model)
        if not self.vision:  # decode attends over the whole cache: no K/V copies on the CPU
            use_cpu_gqa_attention(self.model)
        banned = vision_token_ids(self.model.config) if self.vision else ()
        self._banned = (
            torch.tensor(banned, dtype=torch.long, device=self.device) if banned else None
        )
        if self.vision and processor is None:
            raise InvalidConfigError(
                "HFEngine: a vision-language model needs its processor (processor=DIR, the "
                "directory with preprocessor_config.json) to turn images into pixels"
            )
        self._images = ImageInputs(processor) if self.vision else None
        self.max_batch_size = max_batch_size
        self.weights_version = 0
        self.num_batches = 0
        self.batch_sizes: list[int] = []
        self.prefill_tokens = 0
        self.cached_tokens = 0
        if prefix_cache_mb < 0:
            raise InvalidConfigError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        self._prefix = (
            PrefixCache(int(prefix_cache_mb * (1 << 20)))
            if prefix_cache_mb > 0 and not self.vision
            else None
        )
        self._rng = torch.Generator(device=self.device).manual_seed(seed)
        # Generation, scoring and weight loads never overlap on the model.
        self._model_lock = threading.Lock()
        self._pending: list[_Request] = []
        self._pending_lock = threading.Lock()  # the decode thread takes requests from it
        self._serving = False
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    # -- generate: queue, batch, sample ---------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, images: Sequence[Any] = ()
    ) -> Generation:
        if self._closed:
            raise EngineClosedError("HFEngine.generate called after aclose()")
        if len(prompt_ids) == 0:
            raise InvalidConfigError("HFEngine.generate needs a non-empty prompt")
        if not self.vision:
            reject_images(self, images)
        else:
            self._images.check_prompt(prompt_ids, images, self.model.config.image_token_id)
        loop = asyncio.get_running_loop()
        request = _Request(
            [int(t) for t in prompt_ids], params, loop.create_future(), tuple(images)
        )
        with self._pending_lock:
            self._pending.append(request)
        worker = self._worker
        # A worker left by an event loop that has ended (asyncio.run called again) serves
        # nobody: start one on this loop.
        stale = worker is None or worker.done() or worker.get_loop() is not loop
        if not self._serving or stale:
            self._serving = True
            self._worker = loop.create_task(self._serve(loop))
        return await request.future

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the decode loop while there is work (it returns when the batch and
        the queue are both empty; a request that arrived meanwhile restarts it)."""
        while True:
            await asyncio.to_thread(self._decode_loop, loop)
            with self._pending_lock:
                if not self._pending:
                    self._serving = False
                    return

    def _take_pending(self, room: int) -> list[_Request]:
        with self._pending_lock:
            taken = self._pending[:room]
            del self._pending[:room]
        return taken

    def _decode_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        batch: _Batch | None = None
        with self._model_lock, torch.inference_mode():
            while True:
                live = len(batch.rows) if batch else 0
                arrived = self._take_pending(self.max_batch_size - live)
                if arrived:
                    batch = self._admit_safely(batch, arrived, loop)
                if batch is None or not batch.rows:
                    return
                try:
                    batch = self._decode_step(batch, loop)
                except Exception as exc:  # every waiting row sees the failure
                    for row in batch.rows:
                        _resolve(loop, row.request.future, exc)
                    batch = None

    def _admit_safely(
        self, batch: _Batch | None, requests: list[_Request], loop: asyncio.AbstractEventLoop
    ) -> _Batch | None:
        """:meth:`_admit`; if the group's prefill fails, each request is retried alone, so
        only the one at fault fails (its caller gets the exception) and the batch goes on."""
        try:
            return self._admit(batch, requests, loop)
        except Exception as exc:
            if len(requests) == 1:
                _resolve(loop, requests[0].future, exc)
                return batch
        for request in requests:
            batch = self._admit_safely(batch, [request], loop)
        return batch

    def _admit(
        self, batch: _Batch | None, requests: list[_Request], loop: asyncio.AbstractEventLoop
    ) -> _Batch | None:
        """Prefill ``requests`` together and join them to ``batch``."""
        rows = []
        for request in requests:
            if request.params.max_new_tokens <= 0:
                _resolve(loop, request.future, Generation([], [], "length"))
            else:
                rows.append(self._new_row(request))
        if not rows:
            return batch
        if self._prefix is not None:
            self._seed_shared_prefix(rows)
        parts = [] if batch is None else [batch]
        fresh: list[_Row] = []
        # Every row that continues a kept prefix, whichever entry and however long, joins
        # one forward: each forward streams all the weights, and short ones multiply
        # slowly (8 rows continuing 8 entries by 41 tokens on SmolLM2: 5.8 s of CPU as 8
        # forwards, 4.3 s as one).
        hits: list[tuple[_Row, int, CachedPrefix]] = []
        for row in rows:
            hit = self._prefix.lookup(row.request.prompt) if self._prefix is not None else None
            if hit is None:
                fresh.append(row)
            else:
                hits.append((row, *hit))
        if hits:
            parts.append(self._prefill_after(hits))
        if fresh:
            parts.append(self._prefill(fresh))
        # One concatenation: joining rows one at a time copies the running cache each time.
        batch = _Batch.concat(parts)
        for row in rows:
            row.admitted_at, row.batch_size = time.perf_counter(), len(batch.rows)
        return batch

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
        if shared < _MIN_SHARED_PREFIX or (hit is not None and hit[0] >= shared):
            return
        ids = prompts[0][:shared]
        inputs = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=inputs, use_cache=True, logits_to_keep=1)
        self.prefill_tokens += shared
        layers = out.past_key_values.layers
        if any(type(layer) is not DynamicLayer for layer in layers):
            return
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

    def _decode_step(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> _Batch | None:
        """Sample one token per row; resolve and drop finished rows; run the model once."""
        tokens = self._sample(batch.logits, batch.rows)
        keep = []
        for i, row in enumerate(batch.rows):
            if self._append(row, tokens[i]) or row.request.future.cancelled():
                if self._prefix is not None and row.finish_reason is not None:
                    self._keep_prefix(batch, i)
                _resolve(loop, row.request.future, self._generation(row))
            else:
                keep.append(i)
        if not keep:
            return None
        if len(keep) < len(batch.rows):  # drop finished rows from the batch and the cache
            batch = batch.select(keep)
            tokens = tokens[torch.tensor(keep, device=self.device)]
        attention_mask = torch.cat(
            [batch.attention_mask, batch.attention_mask.new_ones(len(batch.rows), 1)], dim=1
        )
        position_ids = batch.next_position[:, None]
        if self.vision:  # a text token: one position, repeated on the three axes
            position_ids = position_ids[None].expand(3, -1, -1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.cache, batch.attention_mask = out.past_key_values, attention_mask
        batch.next_position = batch.next_position + 1
        batch.logits = out.logits[:, -1].float()
        return batch

    def _generation(self, row: _Row) -> Generation:
        return Generation(
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            finish_reason=row.finish_reason or "length",
            metrics={
                "batch_size": float(row.batch_size),
                "queue_s": row.admitted_at - row.request.queued_at,
                "generate_s": time.perf_counter() - row.admitted_at,
                "weights_version": float(self.weights_version),
                "prefill_tokens": float(len(row.request.prompt) - row.cached),
                "cached_tokens": float(row.cached),
            },
        )

    def _new_row(self, request: _Request) -> _Row:
        seed = request.params.seed
        generator = None
        if seed is not None and request.params.temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        return _Row(request, StopChecker(request.params.stop, self.tokenizer.decode), generator)

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        pad, device = self.tokenizer.pad_token_id, self.device
        ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long, device=device)
            mask[i, width - len(prompt) :] = 1
        return ids, mask

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """One token per row; records each row's logprob in ``row.logprobs``.

        Sampling is the exponential race (Gumbel-max): ``argmax(log p - log E)``
        with ``E ~ Exp(1)`` per token draws from ``p`` exactly, in one batched
        argmax. Each seeded row fills its own noise from its own generator, so
        its tokens do not depend on what shares the batch; the unseeded rows
        share one draw from the engine's generator.
        """
        params = [row.request.params for row in rows]
        temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
        logprobs = torch.log_softmax(ban_tokens(logits / temperatures[:, None], self._banned), -1)
        sampled = [i for i, p in enumerate(params) if p.temperature != 0]
        scores = logprobs
        if sampled:
            top_p = torch.tensor([p.top_p for p in params], device=logits.device)
            if bool((top_p < 1.0).any()):
                scores = _top_p_mask(logprobs, top_p)
            noise = torch.ones_like(logprobs)  # greedy rows: log 1 = 0 leaves the argmax
            shared = [i for i in sampled if rows[i].generator is None]
            for i in sampled:
                if rows[i].generator is not None:
                    noise[i].exponential_(generator=rows[i].generator)
            if shared:
                noise[shared] = torch.empty(
                    (len(shared), logprobs.shape[-1]), device=logits.device
                ).exponential_(generator=self._rng)
            scores = scores - noise.log()
        tokens = torch.argmax(scores, -1)
        chosen = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
        for row, logprob in zip(rows, chosen):
            row.logprobs.append(logprob)
        return tokens

    def _append(self, row: _Row, token: torch.Tensor) -> bool:
        """Add a sampled token to its row; True if the row is finished."""
        row.token_ids.append(int(token))
        if row.token_ids[-1] == self.tokenizer.eos_token_id:
            row.finish_reason = "eos"
        elif row.stop and row.stop.hit(row.token_ids):
            row.finish_reason = "stop"
        elif len(row.token_ids) >= row.request.params.max_new_tokens:
            row.finish_reason = "length"
        return row.finish_reason is not None

    # -- weights and scoring ------------------------------------------------------

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Copy ``state_dict`` into the model's parameters in place (waits for a
        running batch to finish). Raises :class:`InvalidConfigError` naming
        missing or unexpected keys; tied weights may be omitted."""
        own = self.model.state_dict()
        unexpected = sorted(set(state_dict) - set(own))
        tied = _tied_keys(self.model)
        missing = sorted(set(own) - set(state_dict) - tied)
        if unexpected or missing:
            raise InvalidConfigError(
                f"HFEngine.load_weights: the state dict does not match the model "
                f"(missing {missing[:5]}, unexpected {unexpected[:5]}); pass the full state "
                "dict of the same architecture (unwrapped: no 'module.' prefix)"
            )
        with self._model_lock, torch.no_grad():
            for name, tensor in state_dict.items():
                target = own[name]
                if not isinstance(tensor, torch.Tensor):
                    tensor = torch.as_tensor(tensor, device=target.device)
                target.copy_(tensor)
            if self._prefix is not None:  # kept caches belong to the old weights
                self._prefix.clear()
        self.weights_version += 1

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Copy each ``(name, tensor)`` into the model as it arrives (no second copy of
        the model is ever held). The whole stream is consumed even when a name is wrong
        (the trainer's gathers behind it are collectives every rank must finish); then
        :class:`InvalidConfigError` names the missing and unexpected keys."""
        own = self.model.state_dict()
        seen: set[str] = set()
        unexpected: list[str] = []
        with self._model_lock, torch.no_grad():
            for name, tensor in weights:
                target = own.get(name)
                if target is None:
                    unexpected.append(name)
                    continue
                if not isinstance(tensor, torch.Tensor):
                    tensor = torch.as_tensor(tensor)
                target.copy_(tensor)
                seen.add(name)
            if self._prefix is not None:  # kept caches belong to the old weights
                self._prefix.clear()
        missing = sorted(set(own) - seen - _tied_keys(self.model))
        if unexpected or missing:
            raise InvalidConfigError(
                f"HFEngine.update_weights: the weights do not match the model (missing "
                f"{missing[:5]}, unexpected {unexpected[:5]}); stream every parameter of the "
                "same architecture under its Hugging Face name (no 'module.' prefix)"
            )
        self.weights_version += 1

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        """``log_softmax(logits / T)`` of token t given tokens < t, for t >= 1
        (``T == 0`` scores at ``T = 1``, as greedy generation reports);
        ``images[i]`` are sequence ``i``'s images."""
        if not self.vision:
            reject_images(self, images)
        scale = temperature or 1.0
        images = list(images) if images is not None else [()] * len(sequences)
        results: list[list[float]] = []
        with self._model_lock, torch.inference_mode():
            for start in range(0, len(sequences), self.max_batch_size):
                end = start + self.max_batch_size
                chunk = [list(s) for s in sequences[start:end]]
                pictures = [image for row in images[start:end] for image in row]
                results.extend(self._score_chunk(chunk, scale, pictures))
        return results

    def _score_chunk(
        self, sequences: list[list[int]], scale: float, images: list[Any]
    ) -> list[list[float]]:
        # Right padding: under a causal mask, pads after a sequence change nothing in it.
        width = max(len(s) for s in sequences)
        pad, device = self.tokenizer.pad_token_id, self.device
        ids = torch.full((len(sequences), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for i, seq in enumerate(sequences):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
            mask[i, : len(seq)] = 1
        extra: dict[str, torch.Tensor] = {}
        if self.vision:
            extra = self._images(images, device) if images else {}
            extra["position_ids"] = rope_positions(
                self.model.model, ids, mask, extra.get("image_grid_thw")
            )
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits
        logprobs = torch.log_softmax(ban_tokens(logits[:, :-1].float() / scale, self._banned), -1)
        chosen = logprobs.gather(2, ids[:, 1:, None])[..., 0]
        return [chosen[i, : len(seq) - 1].tolist() for i, seq in enumerate(sequences)]

    async def aclose(self) -> None:
        self._closed = True
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for request in pending:
            if not request.future.done():
                request.future.set_exception(EngineClosedError("HFEngine closed"))
        if self._worker is not None and not self._worker.done():
            await self._worker  # let the running rows finish; the thread cannot be killed


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


def _top_p_mask(logprobs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``logprobs`` with ``-inf`` outside each row's smallest set of tokens whose
    mass is >= its ``top_p`` (rows with ``top_p >= 1`` unchanged)."""
    sorted_logprobs, order = torch.sort(logprobs, descending=True, dim=-1)
    sorted_probs = sorted_logprobs.exp()
    # Keep a token if the mass before it is < top_p (the first is always kept).
    keep_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < top_p[:, None]
    keep_sorted |= top_p[:, None] >= 1.0
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logprobs.masked_fill(~keep, float("-inf"))


def _tied_keys(model: Any) -> set[str]:
    """State-dict keys that alias another parameter (e.g. a tied lm_head)."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        key = tensor.data_ptr()
        if key in seen:
            tied.add(name)
        else:
            seen[key] = name
    return tied
