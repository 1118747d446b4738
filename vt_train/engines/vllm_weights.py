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

This module is imported inside vLLM's worker processes; it needs nothing but
torch there.
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
    """:func:`pack`'s ``(name, tensor)`` back (a fresh, writable tensor)."""
    import torch

    name, dtype, shape, data = packed
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return name, raw.view(getattr(torch, dtype)).reshape(shape)


class WeightReceiver:
    """Mixed into vLLM's worker class (``worker_extension_cls``)."""

    model_runner: Any  # the worker's, set by vLLM

    def vt_load_weights(self, weights: Sequence[Packed]) -> int:
        """Load :func:`pack`'ed tensors (Hugging Face names) into this worker's model;
        returns how many were given."""
        model = self.model_runner.get_model()
        model.load_weights(weights=[unpack(w) for w in weights])
        return len(weights)
