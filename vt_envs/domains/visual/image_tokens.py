"""How many tokens an image costs a Qwen2-VL / Qwen2.5-VL-style policy.

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

import math
from dataclasses import dataclass

from vt_envs.errors import InvalidConfigError

__all__ = ["QWEN2_VL_DEFAULTS", "ImageTokenSpec", "smart_resize"]


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
