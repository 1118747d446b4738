"""Write a Qwen2-VL-style processor directory built from the shipped tokenizer.

A VLM policy's processor is a tokenizer that knows the vision tokens
(``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``) plus an image
processor's geometry (``preprocessor_config.json``). :func:`write_qwen_vl_processor`
makes one locally, with no download: the shipped 2048-id BPE with the vision
tokens appended as special tokens (ids 2048-2051), a ChatML template that
renders image parts as Qwen2-VL's does, and a ``Qwen2VLImageProcessor``
configuration. ``gym.make(id, processor=DIR)`` reads it, and
``transformers`` loads it (``AutoTokenizer``, ``Qwen2VLImageProcessor``),
so tests can compare the env's ids with the processor's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from vt_envs.core.image_tokens import QWEN_VISION_TOKENS
from vt_envs.core.tokenizer import DEFAULT_TOKENIZER_DIR

__all__ = ["QWEN_VL_CHAT_TEMPLATE", "VIDEO_PAD", "write_qwen_vl_processor"]

VIDEO_PAD = "<|video_pad|>"

#: ChatML whose message contents may be strings or lists of parts; an image part
#: renders as Qwen2-VL's template renders it.
QWEN_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
_IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


def write_qwen_vl_processor(
    out: str | os.PathLike[str],
    *,
    min_pixels: int = 56 * 56,
    max_pixels: int = 14 * 14 * 4 * 1280,
    patch_size: int = 14,
    merge_size: int = 2,
) -> Path:
    """Write the processor directory ``out`` (created if needed) and return its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (*QWEN_VISION_TOKENS, VIDEO_PAD)]
    )
    tokenizer.save(str(out / "tokenizer.json"))
    base = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer_config.json").read_text("utf-8"))
    specials = [*base["additional_special_tokens"], *QWEN_VISION_TOKENS, VIDEO_PAD]
    config = {
        **base,
        "chat_template": QWEN_VL_CHAT_TEMPLATE,
        "additional_special_tokens": specials,
        "processor_class": "Qwen2VLProcessor",
    }
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _IMAGE_MEAN,
        "image_std": _IMAGE_STD,
        "rescale_factor": 1 / 255,
        "resample": 3,
        "patch_size": patch_size,
        "merge_size": merge_size,
        "temporal_patch_size": 2,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
    }
    special_map = {"eos_token": base["eos_token"], "pad_token": base["pad_token"]}
    files = {
        "tokenizer_config.json": config,
        "special_tokens_map.json": {**special_map, "additional_special_tokens": specials},
        "preprocessor_config.json": preprocessor,
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return out
