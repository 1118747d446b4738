"""Procedural V*-style scenes: large cluttered images with small targets, answers known.

Each scene is a pure function of ``(kind, seed)``: a canvas of at least 1024
pixels a side, filled with clutter (filled rectangles, ellipses and lines in
muted colours, and distractor words in large grey type), and small targets
drawn in shapes and colours the clutter never uses, so each question has
exactly one answer:

- ``label``: a tiny white tag with a black border holding a 4-character code
  in 9–12 px type — "What does the small tag say?";
- ``color``: one small filled triangle in a saturated colour — "What colour
  is the small triangle?";
- ``count``: 2–7 small black crosses inside a red-outlined box (and a few
  outside it) — "How many … inside the red box?";
- ``relation``: a small ring and a small star in two named colours —
  "Is the ring left of / right of (above / below) the star?".

:class:`Scene` records each target's pixel box, which the oracle zooms into
and the tests check the crops against. Text is drawn with Pillow's built-in
scalable font (``ImageFont.load_default(size=...)``), so nothing is read
from the system.
"""

from __future__ import annotations

import functools
import math
import string
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vt_envs.domains.visual.bbox import union_box
from vt_envs.domains.visual.ops import as_image_array
from vt_envs.errors import InvalidConfigError

__all__ = ["COLOURS", "SCENE_KINDS", "Scene", "render_scene"]

SCENE_KINDS = ("label", "color", "count", "relation")

#: The saturated colours targets use (clutter is desaturated, so never confusable).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 20, 30),
    "green": (20, 170, 40),
    "blue": (25, 60, 230),
    "yellow": (250, 215, 0),
    "purple": (130, 30, 190),
    "orange": (255, 130, 0),
    "cyan": (0, 200, 220),
    "magenta": (230, 0, 170),
}
# Letters and digits that no small font renders alike (no 0/O, 1/I/L, 5/S, 8/B, 2/Z).
_CODE_CHARS = "".join(c for c in string.ascii_uppercase + string.digits if c not in "0O1IL5S8B2Z")
_WORDS = ("market", "river", "north", "signal", "garden", "harbor", "summit", "valley")


@dataclass(frozen=True)
class Scene:
    """One rendered scene and its question.

    Attributes:
        kind: one of :data:`SCENE_KINDS`.
        image: ``HxWx3 uint8`` (read-only).
        question: the question, without options.
        answer: the correct answer as text (``"K7QX"``, ``"blue"``, ``"4"``, ``"left"``).
        choices: candidate answers for the multiple-choice form (the answer among them).
        targets: pixel boxes ``(left, top, right, bottom)`` of what the answer depends on.
    """

    kind: str
    image: np.ndarray
    question: str
    answer: str
    choices: tuple[str, ...]
    targets: tuple[tuple[int, int, int, int], ...]

    def target_union(self, margin: int = 0) -> tuple[int, int, int, int]:
        """The smallest box holding every target, grown by ``margin`` (clipped to the image)."""
        height, width = self.image.shape[:2]
        return union_box(self.targets, width, height, margin)


@functools.lru_cache(maxsize=16)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _muted(rng: np.random.Generator) -> tuple[int, int, int]:
    """A desaturated colour: channels within 40 of a mid-grey base."""
    base = int(rng.integers(90, 200))
    return tuple(int(np.clip(base + rng.integers(-40, 41), 0, 255)) for _ in range(3))


def _canvas(rng: np.random.Generator) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    width, height = int(rng.integers(1024, 1537)), int(rng.integers(1024, 1281))
    top, bottom = np.array(_muted(rng)), np.array(_muted(rng))
    ramp = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    background = (top * (1 - ramp) + bottom * ramp).repeat(width, axis=1)
    noise = rng.normal(0.0, 6.0, size=(height, width, 1)).astype(np.float32)
    image = Image.fromarray(np.clip(background + noise, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(150, 260))):
        x, y = int(rng.integers(-50, width)), int(rng.integers(-50, height))
        w, h = int(rng.integers(20, 220)), int(rng.integers(20, 220))
        shape = rng.integers(3)
        if shape == 0:
            draw.rectangle((x, y, x + w, y + h), fill=_muted(rng))
        elif shape == 1:
            draw.ellipse((x, y, x + w, y + h), fill=_muted(rng))
        else:
            draw.line((x, y, x + w, y + h), fill=_muted(rng), width=int(rng.integers(2, 9)))
    for _ in range(int(rng.integers(4, 9))):
        word = _WORDS[int(rng.integers(len(_WORDS)))]
        xy = (int(rng.integers(0, width - 200)), int(rng.integers(0, height - 60)))
        draw.text(xy, word, fill=_muted(rng), font=_font(int(rng.integers(36, 64))))
    return image, draw


def _free_spot(
    rng: np.random.Generator,
    size: tuple[int, int],
    bounds: tuple[int, int, int, int],
    taken: list[tuple[int, int, int, int]],
    gap: int = 24,
) -> tuple[int, int, int, int]:
    """A box of ``size`` inside ``bounds`` at least ``gap`` pixels from every taken box."""
    w, h = size
    left, top, right, bottom = bounds
    for _ in range(500):
        x, y = int(rng.integers(left, right - w)), int(rng.integers(top, bottom - h))
        box = (x, y, x + w, y + h)
        if all(
            box[2] + gap <= t[0]
            or t[2] + gap <= box[0]
            or box[3] + gap <= t[1]
            or t[3] + gap <= box[1]
            for t in taken
        ):
            taken.append(box)
            return box
    raise RuntimeError("no free spot for a target (the scene is too crowded)")  # pragma: no cover


def _triangle(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], fill) -> None:
    left, top, right, bottom = box
    draw.polygon(
        [((left + right) / 2, top), (right - 1, bottom - 1), (left, bottom - 1)], fill=fill
    )


def _cross(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], fill) -> None:
    left, top, right, bottom = box
    draw.line((left, top, right - 1, bottom - 1), fill=fill, width=3)
    draw.line((left, bottom - 1, right - 1, top), fill=fill, width=3)


def _ring(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], fill) -> None:
    draw.ellipse((box[0], box[1], box[2] - 1, box[3] - 1), outline=fill, width=4)


def _star(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], fill) -> None:
    left, top, right, bottom = box
    cx, cy, r = (left + right) / 2, (top + bottom) / 2, (right - left) / 2
    points = [
        (
            cx + (r if i % 2 == 0 else r * 0.45) * math.sin(i * math.pi / 5),
            cy - (r if i % 2 == 0 else r * 0.45) * math.cos(i * math.pi / 5),
        )
        for i in range(10)
    ]
    draw.polygon(points, fill=fill)


def _label(rng: np.random.Generator) -> Scene:
    image, draw = _canvas(rng)
    width, height = image.size
    code = "".join(_CODE_CHARS[i] for i in rng.integers(len(_CODE_CHARS), size=4))
    font = _font(int(rng.integers(9, 13)))
    left, top, right, bottom = draw.textbbox((0, 0), code, font=font)
    size = (right - left + 8, bottom - top + 8)
    box = _free_spot(rng, size, (16, 16, width - 16, height - 16), [])
    draw.rectangle(
        (box[0], box[1], box[2] - 1, box[3] - 1), fill=(255, 255, 255), outline=(0, 0, 0)
    )
    draw.text((box[0] + 4 - left, box[1] + 4 - top), code, fill=(0, 0, 0), font=font)
    decoys = set()
    while len(decoys) < 3:
        chars = list(code)
        chars[int(rng.integers(4))] = _CODE_CHARS[int(rng.integers(len(_CODE_CHARS)))]
        if "".join(chars) != code:
            decoys.add("".join(chars))
    return Scene(
        "label",
        as_image_array(image),
        "What does the small white tag with a black border say?",
        code,
        (code, *sorted(decoys)),
        (box,),
    )


def _color(rng: np.random.Generator) -> Scene:
    image, draw = _canvas(rng)
    width, height = image.size
    names = list(COLOURS)
    colour = names[int(rng.integers(len(names)))]
    side = int(rng.integers(14, 23))
    box = _free_spot(rng, (side, side), (16, 16, width - 16, height - 16), [])
    _triangle(draw, box, COLOURS[colour])
    others = [n for n in names if n != colour]
    decoys = [others[i] for i in rng.choice(len(others), size=3, replace=False)]
    return Scene(
        "color",
        as_image_array(image),
        "What colour is the small triangle?",
        colour,
        (colour, *decoys),
        (box,),
    )


def _count(rng: np.random.Generator) -> Scene:
    image, draw = _canvas(rng)
    width, height = image.size
    region_w, region_h = int(rng.integers(260, 420)), int(rng.integers(260, 420))
    region = _free_spot(rng, (region_w, region_h), (16, 16, width - 16, height - 16), [])
    draw.rectangle(
        (region[0], region[1], region[2] - 1, region[3] - 1), outline=COLOURS["red"], width=4
    )
    inside: list[tuple[int, int, int, int]] = []
    n = int(rng.integers(2, 8))
    interior = (region[0] + 10, region[1] + 10, region[2] - 10, region[3] - 10)
    for _ in range(n):
        _cross(draw, _free_spot(rng, (14, 14), interior, inside, gap=10), (0, 0, 0))
    outside = [region]
    for _ in range(int(rng.integers(2, 6))):
        _cross(
            draw, _free_spot(rng, (14, 14), (16, 16, width - 16, height - 16), outside), (0, 0, 0)
        )
    choices = tuple(dict.fromkeys([str(n), *(str(n + d) for d in (-1, 1, 2, -2) if n + d >= 0)]))
    return Scene(
        "count",
        as_image_array(image),
        "How many small black crosses (x marks) are inside the red-outlined box?",
        str(n),
        choices[:4],
        (region,),
    )


def _relation(rng: np.random.Generator) -> Scene:
    image, draw = _canvas(rng)
    width, height = image.size
    names = list(COLOURS)
    ring_colour, star_colour = (names[i] for i in rng.choice(len(names), size=2, replace=False))
    horizontal = bool(rng.integers(2))
    taken: list[tuple[int, int, int, int]] = []
    while True:
        taken.clear()
        ring = _free_spot(rng, (20, 20), (16, 16, width - 16, height - 16), taken)
        star = _free_spot(rng, (20, 20), (16, 16, width - 16, height - 16), taken)
        axis = 0 if horizontal else 1
        if abs(ring[axis] - star[axis]) >= 80:
            break
    _ring(draw, ring, COLOURS[ring_colour])
    _star(draw, star, COLOURS[star_colour])
    if horizontal:
        answer, other = ("left", "right") if ring[0] < star[0] else ("right", "left")
        question = (
            f"Is the small {ring_colour} ring to the left or to the right of the small "
            f"{star_colour} star?"
        )
    else:
        answer, other = ("above", "below") if ring[1] < star[1] else ("below", "above")
        question = f"Is the small {ring_colour} ring above or below the small {star_colour} star?"
    return Scene("relation", as_image_array(image), question, answer, (answer, other), (ring, star))


_RENDER = {"label": _label, "color": _color, "count": _count, "relation": _relation}


def render_scene(kind: str, seed: int) -> Scene:
    """The scene of ``kind`` for ``seed`` (the same pixels on every machine with this Pillow)."""
    if kind not in _RENDER:
        raise InvalidConfigError(f"scene kind must be one of {SCENE_KINDS}, got {kind!r}")
    return _RENDER[kind](np.random.default_rng([SCENE_KINDS.index(kind), seed]))
