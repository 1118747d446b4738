"""The tiny vision-language policy VT builds itself: Qwen2-VL's architecture, random init.

Like the tiny text model (:mod:`vt_train.model`), nothing is downloaded: a
``Qwen2VLForConditionalGeneration`` with a small vision tower (a few
14-pixel-patch transformer blocks and the 2x2 patch merger) and a small
decoder over the vocabulary of a Qwen2-VL-style processor that
:func:`vt_envs.core.vl_processor.write_qwen_vl_processor` writes from the
shipped tokenizer (its 2048 ids plus the four vision tokens). The saved
directory holds the model, the tokenizer and ``preprocessor_config.json``,
so it is at once the model path, the tokenizer and the ``processor=`` of
VT-Visual-v0, and ``transformers`` (and vLLM) load it like any Qwen2-VL.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vt_envs.core.image_tokens import QWEN_VISION_TOKENS
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.core.vl_processor import VIDEO_PAD, write_qwen_vl_processor
from vt_envs.errors import InvalidConfigError
from vt_train.model import TinyModelConfig

__all__ = ["PROCESSOR_FILES", "TinyVisionConfig", "build_tiny_vl_model", "copy_processor_files"]

#: What a processor directory adds to a model directory.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",  # where transformers 5 writes the template
)


@dataclass
class TinyVisionConfig:
    """Shape of the tiny policy's vision tower and of its processor.

    Attributes:
        depth: vision transformer blocks.
        embed_dim: vision width; ``num_heads`` must divide it.
        num_heads: vision attention heads.
        mlp_ratio: vision MLP width over ``embed_dim``.
        min_pixels, max_pixels: the processor's resize bounds; ``max_pixels /
            784`` is the most tokens one image costs (64 * 784: 64 tokens).
    """

    depth: int = 2
    embed_dim: int = 32
    num_heads: int = 2
    mlp_ratio: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 64 * 28 * 28

    def __post_init__(self) -> None:
        for name in ("depth", "embed_dim", "num_heads", "mlp_ratio", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(
                    f"TinyVisionConfig.{name} must be an int >= 1, got {value!r}"
                )
        if self.embed_dim % self.num_heads:
            raise InvalidConfigError(
                f"TinyVisionConfig.num_heads={self.num_heads} must divide "
                f"embed_dim={self.embed_dim}"
            )
        if self.min_pixels > self.max_pixels:
            raise InvalidConfigError(
                f"TinyVisionConfig.min_pixels ({self.min_pixels}) exceeds max_pixels "
                f"({self.max_pixels})"
            )


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL splits each head's rotary half-dimension over (time, height, width)."""
    half = head_dim // 2
    time = half // 4
    height = (half - time) // 2
    return [time, height, half - time - height]


def build_tiny_vl_model(
    text: TinyModelConfig, vision: TinyVisionConfig, processor_dir: str | os.PathLike[str]
) -> nn.Module:
    """A freshly initialised tiny Qwen2-VL over the processor written to ``processor_dir``.

    The processor directory is written (or rewritten) here with ``vision``'s
    pixel bounds; the model's vocabulary and vision token ids come from its
    tokenizer. The same ``text.seed`` gives identical weights; the global
    torch RNG is left as it was.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    write_qwen_vl_processor(
        processor_dir, min_pixels=vision.min_pixels, max_pixels=vision.max_pixels
    )
    tokenizer = load_tokenizer(str(processor_dir))
    start, pad, end = (tokenizer.encode(t)[0] for t in QWEN_VISION_TOKENS)
    head_dim = text.hidden_size // text.num_heads
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": tokenizer.vocab_size,
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "num_hidden_layers": text.num_layers,
            "num_attention_heads": text.num_heads,
            "num_key_value_heads": text.num_kv_heads,
            "max_position_embeddings": text.max_position_embeddings,
            "rope_theta": text.rope_theta,
            "rope_scaling": {"type": "mrope", "mrope_section": _mrope_section(head_dim)},
            "tie_word_embeddings": text.tie_word_embeddings,
            "bos_token_id": tokenizer.eos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": vision.depth,
            "embed_dim": vision.embed_dim,
            "num_heads": vision.num_heads,
            "mlp_ratio": vision.mlp_ratio,
            "hidden_size": text.hidden_size,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=pad,
        video_token_id=tokenizer.encode(VIDEO_PAD)[0],
        vision_start_token_id=start,
        vision_end_token_id=end,
        tie_word_embeddings=text.tie_word_embeddings,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(text.seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.config.vt_tiny_model = {**asdict(text), "vision": asdict(vision)}
    return model.float().eval()


def copy_processor_files(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Copy a processor directory's files (tokenizer + image processor) into ``target``."""
    source, target = Path(source), Path(target)
    for name in PROCESSOR_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def is_processor_dir(path: Any) -> bool:
    """Whether ``path`` is a directory holding a ``preprocessor_config.json``."""
    return isinstance(path, (str, os.PathLike)) and Path(path, "preprocessor_config.json").is_file()
