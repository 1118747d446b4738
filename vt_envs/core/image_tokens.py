"""How many tokens an image costs a policy, and which ids stand for it.

Two encodings of an image in ``obs["tokens"]``:

- :class:`PlaceholderImageTokens` (no processor): one special ``<image>`` id
  per image, the shipped tokenizer's stand-in; a trainer expands it itself.
- :class:`QwenVLImageTokens` (a Qwen2-VL / Qwen2.5-VL processor, given by
  local path): ``<|vision_start|>``, ``N`` x ``<|image_pad|>``,
  ``<|vision_end|>``, exactly as the processor expands the image, so the ids
  match what the VLM sees.

Qwen2-VL's geometry:

The processor resizes each image so both sides are multiples of
``patch_size * merge_size`` (28) and its area lies in ``[min_pixels,
max_pixels]`` ("smart resize"), cuts it into 14-pixel patches, and merges
each 2x2 block of patches into one token. So an ``H x W`` image costs
``(H' / 28) * (W' / 28)`` ``<|image_pad|>`` tokens, where ``H' x W'`` is the
resized size, plus the ``<|vision_start|>`` / ``<|vision_end|>`` pair around
them. :func:`smart_resize` reproduces the processor's arithmetic without
importing it (it needs no torch or torchvision); the tests compare it with
``transformers``' own processor for many sizes.
"""

from __future__ import annotations

import abc
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vt_envs.core.tokenizer import IMAGE_TOKEN, ChatTokenizer
from vt_envs.errors import InvalidConfigError, NoImageTokenError

__all__ = [
    "QWEN2_VL_DEFAULTS",
    "QWEN_VISION_TOKENS",
    "ImageTokenSpec",
    "ImageTokens",
    "PlaceholderImageTokens",
    "QwenVLImageTokens",
    "image_spec_from_config",
    "load_image_tokens",
    "processor_spec",
    "smart_resize",
]

#: The special tokens of a Qwen2-VL-style tokenizer around an image: start, pad, end.
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 14 * 14 * 4 * 1280,
) -> tuple[int, int]:
    """The ``(height, width)`` Qwen2-VL's processor resizes an image to.

    Both sides become multiples of ``factor`` (rounded to the nearest), then
    the area is brought into ``[min_pixels, max_pixels]`` keeping the aspect
    ratio (scaling down with floor, up with ceil, to multiples of ``factor``).
    """
    if height < 1 or width < 1:
        raise InvalidConfigError(f"an image needs a positive size, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise InvalidConfigError(
            f"aspect ratio of a {height}x{width} image exceeds 200, which the processor refuses"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageTokenSpec:
    """A VLM processor's image geometry.

    Attributes:
        patch_size: pixels per patch side (14).
        merge_size: patches merged per token side (2).
        min_pixels, max_pixels: the resized area's bounds.
    """

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resized(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(
            height,
            width,
            factor=self.factor,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """``(t, h, w)`` in patches, as the processor's ``image_grid_thw``."""
        h, w = self.resized(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def seen_height(self, pixels: float, height: int, width: int) -> float:
        """How tall ``pixels`` of an ``height x width`` image are once the processor has
        resized it: what a policy that never zooms gets to see of a small target."""
        return pixels * self.resized(height, width)[0] / height

    def tokens(self, height: int, width: int) -> int:
        """The number of image-pad tokens the image expands to."""
        _, h, w = self.grid(height, width)
        return h * w // (self.merge_size**2)


#: Qwen2-VL / Qwen2.5-VL's processor defaults (``max_pixels`` = 1280 tokens).
QWEN2_VL_DEFAULTS = ImageTokenSpec()


class ImageTokens(abc.ABC):
    """Which ids stand for an image in a token sequence.

    Attributes:
        placeholder: the unexpanded text of one image, as a chat template
            renders it (``<image>``; ``<|vision_start|><|image_pad|><|vision_end|>``).
    """

    placeholder: str

    @abc.abstractmethod
    def ids(self, image: np.ndarray) -> list[int]:
        """The ids that stand for ``image`` (an ``HxWx3`` array)."""

    @abc.abstractmethod
    def count(self, image: np.ndarray) -> int:
        """How many tokens of the policy's context ``image`` costs (``len(ids(image))``)."""

    def collapse(self, text: str) -> str:
        """``text`` (a decode) with each expanded image put back to :attr:`placeholder`."""
        return text

    @abc.abstractmethod
    def spans(self, ids: Sequence[int]) -> list[tuple[int, int]]:
        """``(start, end)`` of each image's ids in ``ids`` (``ids[start:end]``), in order."""


class PlaceholderImageTokens(ImageTokens):
    """One ``<image>`` id per image (the shipped tokenizer's special token)."""

    def __init__(self, tokenizer: ChatTokenizer, token: str = IMAGE_TOKEN):
        self.placeholder = token
        self.token_id = _single_id(tokenizer, token, fix="pass processor=PATH of a VLM processor")

    def ids(self, image: np.ndarray) -> list[int]:
        return [self.token_id]

    def count(self, image: np.ndarray) -> int:
        return 1

    def spans(self, ids: Sequence[int]) -> list[tuple[int, int]]:
        return [(i, i + 1) for i, token in enumerate(ids) if token == self.token_id]


class QwenVLImageTokens(ImageTokens):
    """``<|vision_start|>`` + ``spec.tokens(H, W)`` x ``<|image_pad|>`` + ``<|vision_end|>``."""

    def __init__(self, tokenizer: ChatTokenizer, spec: ImageTokenSpec):
        self.spec = spec
        start, pad, end = QWEN_VISION_TOKENS
        fix = "use the tokenizer saved with the processor"
        self.start_id, self.pad_id, self.end_id = (
            _single_id(tokenizer, token, fix=fix) for token in QWEN_VISION_TOKENS
        )
        self.placeholder = start + pad + end
        self._expanded = re.compile(f"{re.escape(start)}(?:{re.escape(pad)})+{re.escape(end)}")

    def ids(self, image: np.ndarray) -> list[int]:
        height, width = image.shape[:2]
        return [self.start_id, *[self.pad_id] * self.spec.tokens(height, width), self.end_id]

    def count(self, image: np.ndarray) -> int:
        height, width = image.shape[:2]
        return self.spec.tokens(height, width) + 2

    def collapse(self, text: str) -> str:
        return self._expanded.sub(self.placeholder, text)

    def spans(self, ids: Sequence[int]) -> list[tuple[int, int]]:
        found, start = [], None
        for i, token in enumerate(ids):
            if token == self.start_id:
                start = i
            elif token == self.end_id and start is not None:
                found.append((start, i + 1))
                start = None
        return found


def _single_id(tokenizer: ChatTokenizer, token: str, *, fix: str) -> int:
    ids = tokenizer.encode(token)
    if len(ids) != 1 or token not in tokenizer.special_tokens:
        raise NoImageTokenError(
            f"tokenizer {tokenizer.name!r} has no special token {token!r} (it encodes to "
            f"{len(ids)} ids); an image needs it in the token sequence: {fix}"
        )
    return ids[0]


def image_spec_from_config(config: Mapping[str, Any]) -> ImageTokenSpec:
    """The geometry in a Qwen2-VL ``preprocessor_config.json`` (old or new field names).

    Top-level ``min_pixels`` / ``max_pixels`` win over ``size`` (as the
    processor reads them); ``size`` is ``{"shortest_edge", "longest_edge"}``
    (transformers 5) or ``{"min_pixels", "max_pixels"}``.
    """
    size = config.get("size") or {}
    defaults = QWEN2_VL_DEFAULTS
    min_pixels = config.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
    max_pixels = config.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
    return ImageTokenSpec(
        patch_size=int(config.get("patch_size", defaults.patch_size)),
        merge_size=int(config.get("merge_size", defaults.merge_size)),
        min_pixels=int(min_pixels or defaults.min_pixels),
        max_pixels=int(max_pixels or defaults.max_pixels),
    )


def _processor_config(processor: Any) -> dict[str, Any]:
    if isinstance(processor, (str, os.PathLike)):
        path = Path(processor) / "preprocessor_config.json"
        if not path.is_file():
            raise InvalidConfigError(
                f"processor must be a local directory holding preprocessor_config.json (a "
                f"Qwen2-VL-style processor saved with save_pretrained); {str(path)!r} does not "
                "exist. Nothing is downloaded"
            )
        return json.loads(path.read_text(encoding="utf-8"))
    image_processor = getattr(processor, "image_processor", processor)
    to_dict = getattr(image_processor, "to_dict", None)
    if to_dict is None:
        raise InvalidConfigError(
            "processor must be the path of a local processor directory or a Hugging Face "
            f"processor / image processor object; got {type(processor).__name__}"
        )
    return dict(to_dict())


def processor_spec(processor: Any) -> ImageTokenSpec:
    """The image geometry of ``processor``: the path of a local Qwen2-VL / Qwen2.5-VL-style
    processor directory (its ``preprocessor_config.json``) or a processor object."""
    return image_spec_from_config(_processor_config(processor))


def load_image_tokens(tokenizer: ChatTokenizer, spec: ImageTokenSpec | None = None) -> ImageTokens:
    """The image encoding for ``tokenizer``: one placeholder per image, or (with a
    processor's ``spec``) the processor's expansion. Raises :class:`InvalidConfigError`
    if the tokenizer lacks the tokens the encoding needs."""
    if spec is None:
        return PlaceholderImageTokens(tokenizer)
    return QwenVLImageTokens(tokenizer, spec)
