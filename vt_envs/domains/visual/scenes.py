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
- ``count``: 1–8 small black crosses inside a red-outlined box (and a few
  outside it) — "How many … inside the red box?";
- ``relation``: a small ring and a small star in two named colours —
  "Is the ring left of / right of (above / below) the star?".

A scene is planned before it is drawn: :func:`describe_scene` draws the
size, the question, the answer, the choices and the targets from one seeded
stream without touching a pixel (so a task is written in well under a
millisecond), and :func:`render_scene` paints that plan over clutter drawn
from a second stream. :class:`Scene` records each target's pixel box, which
the oracle zooms into and the tests check the crops against. Text is drawn
with Pillow's built-in scalable font (``ImageFont.load_default(size=...)``),
so nothing is read from the system.

The choices never point at the answer (an options-only policy scores chance;
``tests/domains/visual/test_visual_shortcuts.py`` plays the adversaries of
:mod:`~vt_envs.domains.visual.shortcuts`): each kind's options are
*exchangeable* — drawn as a set first, the answer then one member chosen
uniformly — so no statistic of the options (rank, medoid, length, letters)
tells which one it is:

- ``count``: four consecutive numbers, a uniform start in 1–5, and the answer
  at a uniform rank among them (smallest to largest);
- ``label``: four codes around a random centre code, each changing a
  different one of its four characters, so every two options differ in
  exactly two characters; the tag shows one of them, chosen uniformly;
- ``color``: the answer and three other colours, all uniform;
- ``relation``: the two directions of the asked axis.
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

__all__ = [
    "COLOURS",
    "SCENE_KINDS",
    "Mark",
    "Scene",
    "SceneSpec",
    "cluttered_canvas",
    "describe_scene",
    "free_spot",
    "render_scene",
    "scene_font",
]

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
_BLACK = (0, 0, 0)

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Mark:
    """One target (or frame) a scene paints over its clutter: a ``shape`` of
    ``_PAINT`` in ``box``, with its colour, or a tag's ``text`` in ``font_size`` type."""

    shape: str
    box: Box
    colour: tuple[int, int, int] = _BLACK
    text: str = ""
    font_size: int = 0


@dataclass(frozen=True)
class SceneSpec:
    """A scene without its pixels (cheap: no drawing).

    Attributes:
        kind: one of :data:`SCENE_KINDS`.
        size: ``(width, height)`` of the image.
        question: the question, without options.
        answer: the correct answer as text (``"K7QX"``, ``"blue"``, ``"4"``, ``"left"``).
        choices: candidate answers for the multiple-choice form, the answer first
            (the task shuffles them).
        targets: pixel boxes ``(left, top, right, bottom)`` of what the answer depends on.
        marks: what :func:`render_scene` paints over the clutter.
    """

    kind: str
    size: tuple[int, int]
    question: str
    answer: str
    choices: tuple[str, ...]
    targets: tuple[Box, ...]
    marks: tuple[Mark, ...]


@dataclass(frozen=True)
class Scene:
    """One rendered scene and its question (the fields of :class:`SceneSpec`, and
    ``image``: ``HxWx3 uint8``, read-only)."""

    kind: str
    image: np.ndarray
    question: str
    answer: str
    choices: tuple[str, ...]
    targets: tuple[Box, ...]

    def target_union(self, margin: int = 0) -> Box:
        """The smallest box holding every target, grown by ``margin`` (clipped to the image)."""
        height, width = self.image.shape[:2]
        return union_box(self.targets, width, height, margin)


@functools.lru_cache(maxsize=16)
def scene_font(size: int) -> ImageFont.FreeTypeFont:
    """The scenes' font at ``size`` pixels (PIL's default, cached)."""
    return ImageFont.load_default(size=size)


def _muted(rng: np.random.Generator) -> tuple[int, int, int]:
    """A desaturated colour: channels within 40 of a mid-grey base."""
    base = int(rng.integers(90, 200))
    return tuple(int(np.clip(base + rng.integers(-40, 41), 0, 255)) for _ in range(3))


def _canvas_size(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.integers(1024, 1537)), int(rng.integers(1024, 1281))


def cluttered_canvas(
    rng: np.random.Generator, size: tuple[int, int] | None = None
) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A cluttered canvas of ``size`` (drawn from ``rng`` when ``None``)."""
    width, height = size or _canvas_size(rng)
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
        draw.text(xy, word, fill=_muted(rng), font=scene_font(int(rng.integers(36, 64))))
    return image, draw


def free_spot(
    rng: np.random.Generator,
    size: tuple[int, int],
    bounds: Box,
    taken: list[Box],
    gap: int = 24,
) -> Box:
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


def _tag(draw: ImageDraw.ImageDraw, mark: Mark) -> None:
    box, font = mark.box, scene_font(mark.font_size)
    left, top, _, _ = font.getbbox(mark.text)
    draw.rectangle((box[0], box[1], box[2] - 1, box[3] - 1), fill=(255, 255, 255), outline=_BLACK)
    draw.text((box[0] + 4 - left, box[1] + 4 - top), mark.text, fill=_BLACK, font=font)


def _triangle(draw: ImageDraw.ImageDraw, mark: Mark) -> None:
    left, top, right, bottom = mark.box
    draw.polygon(
        [((left + right) / 2, top), (right - 1, bottom - 1), (left, bottom - 1)], fill=mark.colour
    )


def _cross(draw: ImageDraw.ImageDraw, mark: Mark) -> None:
    left, top, right, bottom = mark.box
    draw.line((left, top, right - 1, bottom - 1), fill=mark.colour, width=3)
    draw.line((left, bottom - 1, right - 1, top), fill=mark.colour, width=3)


def _frame(draw: ImageDraw.ImageDraw, mark: Mark) -> None:
    left, top, right, bottom = mark.box
    draw.rectangle((left, top, right - 1, bottom - 1), outline=mark.colour, width=4)


def _ring(draw: ImageDraw.ImageDraw, mark: Mark) -> None:
    box = mark.box
    draw.ellipse((box[0], box[1], box[2] - 1, box[3] - 1), outline=mark.colour, width=4)


def _star(draw: ImageDraw.ImageDraw, mark: Mark) -> None:
    left, top, right, bottom = mark.box
    cx, cy, r = (left + right) / 2, (top + bottom) / 2, (right - left) / 2
    points = [
        (
            cx + (r if i % 2 == 0 else r * 0.45) * math.sin(i * math.pi / 5),
            cy - (r if i % 2 == 0 else r * 0.45) * math.cos(i * math.pi / 5),
        )
        for i in range(10)
    ]
    draw.polygon(points, fill=mark.colour)


_PAINT = {
    "tag": _tag,
    "triangle": _triangle,
    "cross": _cross,
    "frame": _frame,
    "ring": _ring,
    "star": _star,
}


def _inner(size: tuple[int, int]) -> Box:
    return (16, 16, size[0] - 16, size[1] - 16)


def _code_cluster(rng: np.random.Generator) -> tuple[str, ...]:
    """Four codes around a random centre, option ``i`` changing its character ``i``:
    every two differ in exactly two characters, so none is closer to the rest."""
    centre = [_CODE_CHARS[i] for i in rng.integers(len(_CODE_CHARS), size=4)]
    codes = []
    for position in range(4):
        others = [c for c in _CODE_CHARS if c != centre[position]]
        code = list(centre)
        code[position] = others[int(rng.integers(len(others)))]
        codes.append("".join(code))
    return tuple(codes)


def _answer_first(options: tuple[str, ...], rng: np.random.Generator) -> tuple[str, ...]:
    """``options`` with a uniformly chosen one (the answer) moved to the front."""
    pick = int(rng.integers(len(options)))
    return (options[pick], *options[:pick], *options[pick + 1 :])


def _label(rng: np.random.Generator) -> SceneSpec:
    size = _canvas_size(rng)
    choices = _answer_first(_code_cluster(rng), rng)
    code, font_size = choices[0], int(rng.integers(9, 13))
    left, top, right, bottom = scene_font(font_size).getbbox(code)
    box = free_spot(rng, (right - left + 8, bottom - top + 8), _inner(size), [])
    question = "What does the small white tag with a black border say?"
    mark = Mark("tag", box, text=code, font_size=font_size)
    return SceneSpec("label", size, question, code, choices, (box,), (mark,))


def _color(rng: np.random.Generator) -> SceneSpec:
    size = _canvas_size(rng)
    names = list(COLOURS)
    colour = names[int(rng.integers(len(names)))]
    side = int(rng.integers(14, 23))
    box = free_spot(rng, (side, side), _inner(size), [])
    others = [n for n in names if n != colour]
    decoys = [others[i] for i in rng.choice(len(others), size=3, replace=False)]
    question = "What colour is the small triangle?"
    mark = Mark("triangle", box, COLOURS[colour])
    return SceneSpec("color", size, question, colour, (colour, *decoys), (box,), (mark,))


def _count(rng: np.random.Generator) -> SceneSpec:
    size = _canvas_size(rng)
    start = int(rng.integers(1, 6))
    choices = _answer_first(tuple(str(start + i) for i in range(4)), rng)
    n = int(choices[0])
    region_w, region_h = int(rng.integers(260, 420)), int(rng.integers(260, 420))
    region = free_spot(rng, (region_w, region_h), _inner(size), [])
    interior = (region[0] + 10, region[1] + 10, region[2] - 10, region[3] - 10)
    inside: list[Box] = []
    crosses = [free_spot(rng, (14, 14), interior, inside, gap=10) for _ in range(n)]
    outside = [region]
    for _ in range(int(rng.integers(2, 6))):
        crosses.append(free_spot(rng, (14, 14), _inner(size), outside))
    question = "How many small black crosses (x marks) are inside the red-outlined box?"
    marks = (Mark("frame", region, COLOURS["red"]), *(Mark("cross", box) for box in crosses))
    return SceneSpec("count", size, question, str(n), choices, (region,), marks)


def _relation(rng: np.random.Generator) -> SceneSpec:
    size = _canvas_size(rng)
    names = list(COLOURS)
    ring_colour, star_colour = (names[i] for i in rng.choice(len(names), size=2, replace=False))
    horizontal = bool(rng.integers(2))
    axis = 0 if horizontal else 1
    while True:
        taken: list[Box] = []
        ring = free_spot(rng, (20, 20), _inner(size), taken)
        star = free_spot(rng, (20, 20), _inner(size), taken)
        if abs(ring[axis] - star[axis]) >= 80:
            break
    if horizontal:
        answer, other = ("left", "right") if ring[0] < star[0] else ("right", "left")
        question = (
            f"Is the small {ring_colour} ring to the left or to the right of the small "
            f"{star_colour} star?"
        )
    else:
        answer, other = ("above", "below") if ring[1] < star[1] else ("below", "above")
        question = f"Is the small {ring_colour} ring above or below the small {star_colour} star?"
    marks = (Mark("ring", ring, COLOURS[ring_colour]), Mark("star", star, COLOURS[star_colour]))
    return SceneSpec("relation", size, question, answer, (answer, other), (ring, star), marks)


_PLAN = {"label": _label, "color": _color, "count": _count, "relation": _relation}


def _stream(kind: str, seed: int, part: int) -> np.random.Generator:
    if kind not in _PLAN:
        raise InvalidConfigError(f"scene kind must be one of {SCENE_KINDS}, got {kind!r}")
    return np.random.default_rng([SCENE_KINDS.index(kind), seed, part])


def describe_scene(kind: str, seed: int) -> SceneSpec:
    """The plan of the scene of ``kind`` for ``seed``: everything but the pixels."""
    return _PLAN[kind](_stream(kind, seed, 0))


def render_scene(kind: str, seed: int) -> Scene:
    """The scene of ``kind`` for ``seed`` (the same pixels on every machine with this Pillow):
    :func:`describe_scene`'s marks painted over clutter from the seed's second stream."""
    spec = describe_scene(kind, seed)
    image, draw = cluttered_canvas(_stream(kind, seed, 1), spec.size)
    for mark in spec.marks:
        _PAINT[mark.shape](draw, mark)
    return Scene(
        kind, as_image_array(image), spec.question, spec.answer, spec.choices, spec.targets
    )
