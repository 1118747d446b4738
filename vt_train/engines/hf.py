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
of copying the whole cache. The batch and its cache live in
:mod:`~vt_train.engines.hf_batch`, the prefills and the prefix reuse in
:mod:`~vt_train.engines.hf_prefill`; this module queues, decodes and samples.

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
from typing import Any

import torch

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
    Generation,
    RolloutEngine,
    SamplingParams,
    StopChecker,
    reject_images,
)
from .hf_batch import _Batch, _Request, _Row
from .hf_batch import _GrowingLayer as _GrowingLayer  # the tests import it from here
from .hf_prefill import _Prefills
from .prefix_cache import CachedPrefix, PrefixCache

__all__ = ["HFEngine"]


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


class HFEngine(_Prefills, RolloutEngine):
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
