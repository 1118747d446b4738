"""The vLLM side of an in-memory weight sync: a worker extension that loads tensors.

:class:`~vt_train.engines.vllm.VLLMEngine` starts vLLM with
``worker_extension_cls`` set to :class:`WeightReceiver`, so every vLLM worker
(one per tensor-parallel shard, in vLLM's own processes) has the method
:meth:`WeightReceiver.vt_load_weights`. The engine streams the trainer's
weights to it in buckets through ``collective_rpc``: vLLM serializes the
tensors' buffers to its workers (no file is written), and each worker's
model loads them with its own ``load_weights``, which maps Hugging Face names
onto vLLM's fused layers (``qkv_proj``, ``gate_up_proj``) and keeps only its
tensor-parallel shard.

Tensors travel as raw bytes with their dtype and shape (:func:`pack`): the
engine core hands ``collective_rpc`` arguments to its workers through pickle,
which cannot carry the zero-copy buffers vLLM decodes tensors into.

A sync is three calls: :meth:`WeightReceiver.vt_begin_weights` puts every layer
in vLLM's layer-wise reload mode (each layer goes back to the checkpoint
format its loader expects — on the CPU, vLLM repacks linear weights for
oneDNN after loading and drops the original parameters), the buckets load,
each layer is processed again as soon as all its tensors have arrived (the
trainer sends them layer by layer), and :meth:`WeightReceiver.vt_end_weights`
finishes the rest and drops caches derived from the old weights.

This module is imported inside vLLM's worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["Packed", "WeightReceiver", "pack", "unpack"]

#: One tensor on the wire: its name, dtype name (``"bfloat16"``), shape and bytes.
Packed = tuple[str, str, tuple[int, ...], bytes]


def pack(name: str, tensor: Any) -> Packed:
    """``tensor`` (any dtype, on any device) as raw bytes, with what rebuilds it."""
    import torch

    flat = tensor.detach().to("cpu").contiguous()
    data = flat.reshape(-1).view(torch.uint8).numpy().tobytes()
    return name, str(flat.dtype).removeprefix("torch."), tuple(flat.shape), data


def unpack(packed: Packed) -> tuple[str, Any]:
    """:func:`pack`'s ``(name, tensor)`` back: a read-only view of the received bytes (no
    copy; a model's loader copies it into its parameter)."""
    import warnings

    import torch

    name, dtype, shape, data = packed
    with warnings.catch_warnings():  # "the given buffer is not writable": it is not written
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(data, dtype=torch.uint8)
    return name, raw.view(getattr(torch, dtype)).reshape(shape)


class WeightReceiver:
    """Mixed into vLLM's worker class (``worker_extension_cls``)."""

    model_runner: Any  # the worker's, set by vLLM
    vllm_config: Any

    def vt_begin_weights(self) -> None:
        """Start a sync: every layer takes checkpoint-format weights again."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def vt_load_weights(self, weights: Sequence[Packed]) -> int:
        """Load :func:`pack`'ed tensors (Hugging Face names) into this worker's model;
        returns how many were given."""
        model = self.model_runner.get_model()
        list(model.load_weights(weights=[unpack(w) for w in weights]) or ())
        return len(weights)

    def vt_end_weights(self) -> None:
        """Finish a sync: process what is left, drop caches of the old weights."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        finalize_layerwise_reload(runner.get_model(), self.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            getattr(runner, reset, lambda: None)()
