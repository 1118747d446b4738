"""Bounding boxes in one stated convention, never guessed.

An env fixes one convention (``bbox_format``) and says it in the system
prompt; a box outside that convention's range is an error the agent reads,
naming the convention in force. No heuristic ("all four values < 1 means
normalized") ever reinterprets a box.

- ``"pixels"`` (default): ``[x1, y1, x2, y2]`` in pixels of the referenced
  image, ``0 <= x1 < x2 <= width``, ``0 <= y1 < y2 <= height``;
- ``"normalized"``: fractions of the width and height, in ``[0, 1]``;
- ``"qwen1000"``: Qwen-VL's grid, integers-or-not in ``[0, 1000]`` for both axes.

:func:`to_pixels` converts a box to integer pixel edges (floor of the left
and top, ceiling of the right and bottom, so the crop contains the box).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vt_envs.errors import InvalidConfigError

__all__ = [
    "BBOX_FORMATS",
    "BoxError",
    "describe_format",
    "from_pixels",
    "to_pixels",
    "union_box",
]

BBOX_FORMATS = ("pixels", "normalized", "qwen1000")
_SCALE = {"normalized": 1.0, "qwen1000": 1000.0}


class BoxError(ValueError):
    """A box the agent gave is invalid in the env's convention (the message is for the agent)."""


def describe_format(bbox_format: str) -> str:
    """One sentence for the system prompt: what a box is in ``bbox_format``."""
    _check(bbox_format)
    if bbox_format == "pixels":
        return (
            "A bbox is [x1, y1, x2, y2] in pixels of the image it refers to: (x1, y1) is the "
            "top-left corner, (x2, y2) the bottom-right; 0 <= x1 < x2 <= width and "
            "0 <= y1 < y2 <= height."
        )
    if bbox_format == "normalized":
        return (
            "A bbox is [x1, y1, x2, y2] as fractions of the image's width and height, each "
            "between 0 and 1: (0, 0) is the top-left corner and (1, 1) the bottom-right."
        )
    return (
        "A bbox is [x1, y1, x2, y2] on a 0-1000 grid over the image (Qwen-VL convention): "
        "(0, 0) is the top-left corner and (1000, 1000) the bottom-right, whatever the image size."
    )


def _check(bbox_format: str) -> None:
    if bbox_format not in BBOX_FORMATS:
        raise InvalidConfigError(f"bbox_format must be one of {BBOX_FORMATS}, got {bbox_format!r}")


def _numbers(box: Any) -> list[float]:
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        raise BoxError(f"bbox must be a list of 4 numbers [x1, y1, x2, y2], got {_show(box)}")
    values = []
    for v in box:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise BoxError(f"bbox values must be finite numbers, got {_show(box)}")
        values.append(float(v))
    return values


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def to_pixels(box: Any, bbox_format: str, width: int, height: int) -> tuple[int, int, int, int]:
    """``box`` in ``bbox_format`` → integer pixel edges ``(left, top, right, bottom)``.

    Raises :class:`BoxError` (with a message for the agent) when the box is
    malformed, out of the convention's range, or has zero area.
    """
    _check(bbox_format)
    x1, y1, x2, y2 = _numbers(box)
    if bbox_format == "pixels":
        limit_x, limit_y, unit = float(width), float(height), "pixels"
    else:
        limit_x = limit_y = _SCALE[bbox_format]
        unit = "fractions (0 to 1)" if bbox_format == "normalized" else "a 0-1000 grid"
    if min(x1, y1) < 0 or x2 > limit_x or y2 > limit_y:
        raise BoxError(
            f"bbox {_show(box)} is outside the image: boxes are in {unit} "
            f"(bbox_format={bbox_format!r}), so x must be in [0, {limit_x:g}] and y in "
            f"[0, {limit_y:g}] for this {width}x{height} image."
        )
    if not (x1 < x2 and y1 < y2):
        raise BoxError(f"bbox {_show(box)} has zero area: need x1 < x2 and y1 < y2.")
    if bbox_format != "pixels":
        x1, x2 = x1 / limit_x * width, x2 / limit_x * width
        y1, y2 = y1 / limit_y * height, y2 / limit_y * height
    if x2 - x1 < 1 or y2 - y1 < 1:
        raise BoxError(
            f"bbox {_show(box)} covers less than one pixel: boxes are in {unit} "
            f"(bbox_format={bbox_format!r})."
        )
    left, top = math.floor(x1), math.floor(y1)
    right, bottom = min(width, math.ceil(x2)), min(height, math.ceil(y2))
    return left, top, right, bottom


def from_pixels(box: Sequence[float], bbox_format: str, width: int, height: int) -> list[float]:
    """Pixel edges → ``bbox_format`` (what an oracle writes)."""
    _check(bbox_format)
    x1, y1, x2, y2 = (float(v) for v in box)
    if bbox_format == "pixels":
        return [int(v) if v.is_integer() else v for v in (x1, y1, x2, y2)]
    scale = _SCALE[bbox_format]
    digits = 4 if bbox_format == "normalized" else 1
    return [
        round(x1 / width * scale, digits),
        round(y1 / height * scale, digits),
        round(x2 / width * scale, digits),
        round(y2 / height * scale, digits),
    ]


def union_box(
    boxes: Sequence[Sequence[int]], width: int, height: int, margin: int = 0
) -> tuple[int, int, int, int]:
    """The smallest pixel box holding every box, grown by ``margin`` and clipped to the image."""
    return (
        max(0, min(b[0] for b in boxes) - margin),
        max(0, min(b[1] for b in boxes) - margin),
        min(width, max(b[2] for b in boxes) + margin),
        min(height, max(b[3] for b in boxes) + margin),
    )
