"""Per-GPU memory of a recipe's training step, estimated from its config.

``vt-train check RECIPE`` prints this estimate: no GPU is needed to find out
that a recipe cannot fit. It counts what one rank holds at the peak of a
micro-batch's backward:

* **model states** (actor, critic, reference), by the ZeRO paper's
  accounting: 16-bit weights and gradients plus fp32 master weights and
  Adam moments (12 bytes per parameter) under bf16; fp32 weights, gradients
  and moments under fp32. ZeRO-1 partitions the optimizer states over the
  ranks, ZeRO-2 the gradients too, ZeRO-3 the weights too; ZeRO-Offload
  moves the optimizer states to the host.
* **ZeRO buffers**: DeepSpeed's default reduce / all-gather buckets (5e8
  elements each) and, under ZeRO-3, its live-parameter cap (1e9 elements).
* **activations** of one micro-batch at its worst case, every row
  ``rollout.max_context`` tokens long, with PyTorch's fused attention (no
  ``L x L`` scores): per token and layer the attention and SwiGLU MLP
  intermediates (``5h + 3 kv + 4 I`` values); with gradient checkpointing
  one ``h``-wide input per layer plus one layer's intermediates.
* **logits** of one LM-head chunk (:class:`vt_train.logprobs.LogprobModel`):
  ``chunk x V`` values through the 16-bit head output, the fp32 logits,
  softmax and their gradients (~20 bytes per value).
* **the rollout engine**: vLLM reserves ``gpu_memory_utilization`` of every
  GPU one of its shards runs on, times the shards each GPU holds — the
  placement of :mod:`vt_train.placement` (one engine per tensor-parallel
  group of ranks, on the group's own GPUs) puts exactly one on each; a
  launch that cannot be placed so is reported. Inside the reservation the
  engine's weights take ``params / tensor_parallel_size`` and the rest is
  its KV cache; a reservation smaller than the weight shard does not fit.
  The HF engine holds a 16-bit copy of the weights (its KV cache is not
  counted).
* **host RAM per rank**: loading the weights (under ZeRO-3 the model is
  built partitioned, :mod:`vt_train.sharded_load`, so a rank holds its
  shard) and a weight sync: one tensor's host copy at a time (at most the
  embedding) plus vLLM's bucket packed and in flight (``2 x 64 MiB``).

It is an estimate: fragmentation, CUDA context (~0.5-1 GB) and NCCL buffers
come on top, so keep a margin of about 10%.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "KNOWN_SHAPES",
    "QWEN25_VL_VISION",
    "MemoryEstimate",
    "ModelShape",
    "activation_bytes",
    "estimate_memory",
    "model_shape",
    "vision_tower_params",
]

GiB = 1024**3
_ZERO_BUCKET = 5e8  # DeepSpeed's reduce_bucket_size / allgather_bucket_size defaults
_ZERO3_LIVE = 1e9  # DeepSpeed's stage3_max_live_parameters default
_LOGIT_BYTES = 20  # per logit of one chunk: bf16 head out, fp32 logits, softmax, grads
_SYNC_BUCKET = 64 * 2**20  # VLLMEngine's weight_bucket_mb default, in bytes


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer (Llama / Qwen2 layout: GQA, SwiGLU)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    model_type: str = "qwen2"
    attention_bias: bool = True  # Qwen2 has q/k/v biases
    vision_params: int = 0  # a vision-language model's vision tower and merger

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> ModelShape:
        """From a Hugging Face ``config.json`` dict (a VL model's: its ``text_config``,
        plus the vision tower counted from its ``vision_config``)."""
        if "text_config" in config and "vision_config" in config:
            text = {**config["text_config"], "model_type": config.get("model_type", "qwen2")}
            text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
            shape = cls.from_hf_config(text, name or config.get("_name_or_path", ""))
            return replace(shape, vision_params=vision_tower_params(config["vision_config"]))
        return cls(
            name=name or config.get("_name_or_path", "") or config.get("model_type", "model"),
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            num_kv_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            model_type=config.get("model_type", "qwen2"),
            attention_bias=config.get("attention_bias", config.get("model_type") == "qwen2"),
        )

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * (self.hidden_size // self.num_heads)

    @property
    def layer_params(self) -> int:
        h, kv, inter = self.hidden_size, self.kv_size, self.intermediate_size
        bias = (h + 2 * kv) if self.attention_bias else 0
        return 2 * h * h + 2 * h * kv + bias + 3 * h * inter + 2 * h  # attn, MLP, 2 norms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embedding_params
        decoder = self.embedding_params + self.num_layers * self.layer_params + self.hidden_size
        return decoder + head + self.vision_params

    @property
    def critic_params(self) -> int:
        """The critic: the same backbone, a scalar value head instead of the LM head."""
        decoder = self.embedding_params + self.num_layers * self.layer_params
        return decoder + 2 * self.hidden_size + self.vision_params

    def layer_activation_values(self) -> int:
        """Values per token one layer keeps for its backward (fused attention)."""
        return 5 * self.hidden_size + 3 * self.kv_size + 4 * self.intermediate_size


def vision_tower_params(vision: dict[str, Any]) -> int:
    """Parameters of a Qwen2-VL / Qwen2.5-VL vision tower from its ``vision_config``:
    the patch embedding, ``depth`` blocks (attention with biases, an MLP — gated SwiGLU
    when ``intermediate_size`` is given, else ``mlp_ratio`` wide — and two norms) and the
    2x2 patch merger into the decoder's width."""
    h = vision.get("hidden_size") if "out_hidden_size" in vision else vision.get("embed_dim")
    h = int(h or vision.get("embed_dim", 1280))
    out = int(vision.get("out_hidden_size", vision.get("hidden_size", h)))
    patch = 3 * vision.get("temporal_patch_size", 2) * vision.get("patch_size", 14) ** 2 * h
    if "intermediate_size" in vision:  # Qwen2.5-VL: gated MLP
        mlp = 3 * h * int(vision["intermediate_size"])
    else:
        mlp = 2 * h * int(h * vision.get("mlp_ratio", 4))
    block = 4 * h * h + 4 * h + mlp + 4 * h
    merged = h * vision.get("spatial_merge_size", 2) ** 2
    merger = merged * merged + merged + merged * out + out + 2 * h
    return patch + int(vision.get("depth", 32)) * block + merger


#: Qwen2.5-VL's vision tower (the same for 3B, 7B and 72B), for shapes known by name.
QWEN25_VL_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
}


def _qwen25(
    name: str, h: int, layers: int, heads: int, kv: int, inter: int, tied: bool
) -> ModelShape:
    vocab = 151936 if tied else 152064
    return ModelShape(name, h, layers, heads, kv, inter, vocab, tied)


#: Qwen2.5 sizes (base, Instruct, Math and Coder share them), keyed by size.
KNOWN_SHAPES: dict[str, ModelShape] = {
    "0.5b": _qwen25("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, tied=True),
    "1.5b": _qwen25("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, tied=True),
    "3b": _qwen25("Qwen2.5-3B", 2048, 36, 16, 2, 11008, tied=True),
    "7b": _qwen25("Qwen2.5-7B", 3584, 28, 28, 4, 18944, tied=False),
    "14b": _qwen25("Qwen2.5-14B", 5120, 48, 40, 8, 13824, tied=False),
}


def model_shape(config: Any) -> ModelShape | None:
    """The policy's shape: from ``config.json`` in the model directory when it
    exists, else from a Qwen2.5 size named in the path (``models/Qwen2.5-Math-7B``),
    else the tiny model's; ``None`` if the path names nothing known."""
    path = config.init_from or config.model.path
    if path is None:
        from vt_envs.core.tokenizer import load_tokenizer
        from vt_train.model import TinyModelConfig

        tiny = TinyModelConfig(**config.model.tiny)
        vocab = load_tokenizer(config.model.tokenizer).vocab_size
        return ModelShape(
            "tiny", tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.num_kv_heads,
            tiny.intermediate_size, vocab, tiny.tie_word_embeddings,
        )  # fmt: skip
    from vt_envs.core.packaged_models import resolve_model

    path = resolve_model(path)  # a packaged model's name: its directory, built once
    config_json = Path(path) / "config.json"
    if config_json.is_file():
        return ModelShape.from_hf_config(json.loads(config_json.read_text()), Path(path).name)
    name = Path(path).name
    match = re.search(r"qwen2\.5\D*?(\d+(?:\.\d+)?b)\b", name, re.IGNORECASE)
    shape = KNOWN_SHAPES.get(match.group(1).lower()) if match else None
    if shape is not None and re.search(r"-vl-", name, re.IGNORECASE):  # Qwen2.5-VL-7B-...
        vision = {**QWEN25_VL_VISION, "out_hidden_size": shape.hidden_size}
        shape = replace(shape, name=f"{shape.name} VL", vision_params=vision_tower_params(vision))
    return shape


def activation_bytes(
    shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool
) -> tuple[float, float]:
    """``(kept, recomputed)``: the bytes a forward over ``tokens`` keeps for its
    backward, and the extra peak of recomputing one layer in the backward
    (0 without gradient checkpointing)."""
    layer = tokens * shape.layer_activation_values() * dtype_bytes
    ends = 2 * tokens * shape.hidden_size * dtype_bytes  # embeddings out, final norm
    if checkpointing:  # one h-wide input per layer; one layer's intermediates at a time
        return shape.num_layers * tokens * shape.hidden_size * dtype_bytes + ends, layer
    return shape.num_layers * layer + ends, 0.0


@dataclass
class MemoryEstimate:
    """Bytes per GPU, by part (see the module docstring for what each counts)."""

    shape: ModelShape
    gpus: int
    gpu_bytes: float
    parts: dict[str, float]
    host_bytes: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    #: Why the recipe cannot run as configured on this launch, whatever the total.
    problems: list[str] = field(default_factory=list)
    #: Lines that explain a part (what a vLLM reservation holds).
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.total <= 0.9 * self.gpu_bytes and not self.problems

    def table(self) -> str:
        gib = self.gpu_bytes / GiB
        lines = [
            f"# memory per GPU, {self.shape.name} ({self.shape.num_params / 1e9:.2f}B parameters) "
            f"on {self.gpus} x {gib:.0f} GiB (estimate; see vt_train/memory.py)"
        ]
        lines += [f"#   {part:<38} {n / GiB:8.1f} GiB" for part, n in self.parts.items() if n]
        lines += [f"#     {note}" for note in self.notes]
        verdict = "fits" if self.fits else "DOES NOT FIT (keep ~10% free)"
        lines.append(f"#   {'total':<38} {self.total / GiB:8.1f} GiB of {gib:.0f}: {verdict}")
        lines += [f"#   problem: {problem}" for problem in self.problems]
        for part, n in self.host_bytes.items():
            lines.append(f"#   host RAM per rank, {part:<20} {n / GiB:8.1f} GiB")
        return "\n".join(lines)


def estimate_memory(
    config: Any, shape: ModelShape, *, gpus: int = 8, gpu_gib: float = 80.0
) -> MemoryEstimate:
    """The per-GPU peak of ``config``'s training step on ``gpus`` GPUs of ``gpu_gib``."""
    ds, optim, rollout, algo = (
        config.deepspeed,
        config.optim,
        config.rollout,
        config.algorithm_config(),
    )
    stage, w = ds.zero_stage, (2 if ds.bf16 else 4)
    weight_div = gpus if stage >= 3 else 1
    grad_div = gpus if stage >= 2 else 1
    optim_div = gpus if stage >= 1 else 1
    optim_bytes = 12 if ds.bf16 else 8  # fp32 master copy + Adam m, v (fp32: m, v)
    offload = ds.offload_optimizer and stage > 0
    parts: dict[str, float] = {}
    host: dict[str, float] = {"loading weights": shape.num_params * w}

    def states(label: str, params: int) -> None:
        parts[f"{label} weights"] = params * w / weight_div
        parts[f"{label} gradients"] = params * w / grad_div
        if offload:
            host[f"{label} optimizer"] = params * optim_bytes / optim_div
        else:
            parts[f"{label} optimizer (fp32)"] = params * optim_bytes / optim_div

    states("actor", shape.num_params)
    if algo.use_critic:
        states("critic", shape.critic_params)
    if algo.kl_coef > 0:
        parts["reference weights"] = shape.num_params * w / weight_div
    if stage in (1, 2):
        parts["ZeRO buckets"] = 2 * _ZERO_BUCKET * w
    elif stage == 3:
        parts["ZeRO buckets + live parameters"] = (
            _ZERO_BUCKET + min(_ZERO3_LIVE, shape.num_params)
        ) * w

    tokens = optim.micro_batch_size * rollout.max_context
    kept, recomputed = activation_bytes(shape, tokens, w, optim.gradient_checkpointing)
    # actor and critic run their backward passes one after the other: the larger counts
    parts["activations (one micro-batch)"] = kept + recomputed
    chunk = min(optim.logprob_chunk_size, tokens)
    parts["logits (one LM-head chunk)"] = chunk * shape.vocab_size * _LOGIT_BYTES

    gpu_bytes = gpu_gib * GiB
    estimate = MemoryEstimate(shape, gpus, gpu_bytes, parts, host)
    if stage == 3:  # built partitioned (deepspeed.zero.Init): a rank loads its shard
        host["loading weights"] = shape.num_params * w / gpus
    host["weight sync (streamed)"] = 2 * _SYNC_BUCKET + shape.embedding_params * w
    if rollout.engine == "vllm":
        _vllm_share(estimate, config, shape, w)
    else:
        parts["HF engine weights"] = shape.num_params * w
    return estimate


def _vllm_share(estimate: MemoryEstimate, config: Any, shape: ModelShape, w: int) -> None:
    """vLLM's reservation on each GPU, by the placement of one node of ``gpus`` ranks."""
    from vt_train.placement import PlacementError, engine_tensor_parallel, plan_placement

    kwargs = config.rollout.engine_kwargs
    tp = engine_tensor_parallel("vllm", kwargs)
    gpus, gpu_bytes = estimate.gpus, estimate.gpu_bytes
    share = kwargs.get("gpu_memory_utilization", 0.9)  # vLLM's default
    try:
        plan = plan_placement(world=gpus, local_world=gpus, gpus_per_node=gpus, tensor_parallel=tp)
    except PlacementError as exc:
        estimate.problems.append(str(exc))
        return
    per_gpu = max(Counter(d for p in plan for d in p.engine_devices).values())
    engines = sum(p.leads for p in plan)
    label = f"vLLM reservation ({share:.0%} x {per_gpu} shard)"
    estimate.parts[label] = share * gpu_bytes * per_gpu
    weights = shape.num_params * w / tp
    kv = share * gpu_bytes - weights
    estimate.notes.append(
        f"{engines} engine(s) x TP {tp} on {gpus} GPUs: each GPU holds one shard, "
        f"{weights / GiB:.1f} GiB of weights and ~{max(kv, 0) / GiB:.1f} GiB of KV cache"
    )
    if kv <= 0:
        estimate.problems.append(
            f"vLLM's {share:.0%} of a GPU ({share * gpu_bytes / GiB:.1f} GiB) cannot hold its "
            f"weight shard ({weights / GiB:.1f} GiB at TP {tp}): raise gpu_memory_utilization "
            "or tensor_parallel_size"
        )
