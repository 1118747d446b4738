"""Image operations of VT-Visual-v0's tools: pure functions on ``HxWx3 uint8`` arrays.

Every operation returns a new array (inputs are never modified, so an image
can be shared by reference between turns, envs and the trainer) and caps
its output at :data:`MAX_SIDE` pixels on the long side and
:data:`MAX_PIXELS` in all, so no call can allocate without bound. Nothing is
written to disk.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

__all__ = [
    "MAX_PIXELS",
    "MAX_SIDE",
    "adjust_contrast",
    "as_image_array",
    "cap_size",
    "crop",
    "flip",
    "grayscale",
    "rotate",
    "zoom",
]

MAX_SIDE = 2048
MAX_PIXELS = 2048 * 2048


def as_image_array(image: np.ndarray | Image.Image) -> np.ndarray:
    """A read-only ``HxWx3 uint8`` C-contiguous array of ``image`` (a copy unless it
    already is one), so holders can share it by reference."""
    if isinstance(image, Image.Image):
        return _frozen(np.asarray(image.convert("RGB")).copy())
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise ValueError(f"an image must be HxWx3 uint8, got shape {array.shape}")
    if array.dtype == np.uint8 and not array.flags.writeable and array.flags.c_contiguous:
        return array
    return _frozen(np.array(array, dtype=np.uint8, order="C"))


def _frozen(fresh: np.ndarray) -> np.ndarray:
    """Mark an array this module just made read-only (no copy)."""
    fresh = np.ascontiguousarray(fresh)
    fresh.setflags(write=False)
    return fresh


def _pil(image: np.ndarray) -> Image.Image:
    return Image.fromarray(np.asarray(image, dtype=np.uint8), "RGB")


def cap_size(
    image: Image.Image, max_side: int = MAX_SIDE, max_pixels: int = MAX_PIXELS
) -> Image.Image:
    """Downscale (keeping the aspect ratio) so both caps hold."""
    width, height = image.size
    scale = min(1.0, max_side / max(width, height), (max_pixels / (width * height)) ** 0.5)
    if scale >= 1.0:
        return image
    size = (max(1, int(width * scale)), max(1, int(height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def crop(image: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """The pixels inside ``box = (left, top, right, bottom)`` (already validated)."""
    left, top, right, bottom = box
    return _frozen(np.array(image[top:bottom, left:right]))


def zoom(image: np.ndarray, box: tuple[int, int, int, int], *, target: int = 672) -> np.ndarray:
    """Crop ``box`` and upscale it so its long side is ``target`` pixels (never downscale)."""
    region = _pil(crop(image, box))
    width, height = region.size
    scale = max(1.0, target / max(width, height))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return as_image_array(cap_size(region.resize(size, Image.Resampling.BICUBIC)))


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate counter-clockwise by ``degrees``, expanding the canvas (exact for multiples of 90)."""
    turns = degrees / 90
    if float(turns).is_integer():
        return _frozen(np.rot90(image, int(turns) % 4).copy())
    rotated = _pil(image).rotate(degrees, expand=True, resample=Image.Resampling.BICUBIC)
    return as_image_array(cap_size(rotated))


def flip(image: np.ndarray, direction: str) -> np.ndarray:
    """Mirror left-right (``"horizontal"``) or top-bottom (``"vertical"``)."""
    axis = 1 if direction == "horizontal" else 0
    return _frozen(np.flip(image, axis=axis).copy())


def grayscale(image: np.ndarray) -> np.ndarray:
    """Luminance, replicated on three channels (the image stays ``HxWx3``)."""
    return as_image_array(ImageOps.grayscale(_pil(image)).convert("RGB"))


def adjust_contrast(image: np.ndarray, factor: float) -> np.ndarray:
    """Scale contrast by ``factor`` (1 = unchanged, 0 = flat grey, 2 = twice)."""
    return as_image_array(ImageEnhance.Contrast(_pil(image)).enhance(factor))
