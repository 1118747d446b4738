"""VT-Visual-v0's building blocks: bbox conventions, image operations, scenes."""

from __future__ import annotations

import numpy as np
import pytest

from vt_envs.domains.visual.bbox import BoxError, describe_format, from_pixels, to_pixels
from vt_envs.domains.visual.ops import (
    MAX_SIDE,
    adjust_contrast,
    as_image_array,
    crop,
    flip,
    grayscale,
    rotate,
    zoom,
)
from vt_envs.domains.visual.scenes import COLOURS, SCENE_KINDS, render_scene
from vt_envs.errors import InvalidConfigError


@pytest.mark.parametrize(
    "fmt, box, expected",
    [
        ("pixels", [10, 20, 30, 40], (10, 20, 30, 40)),
        ("pixels", [10.2, 20.7, 29.1, 39.9], (10, 20, 30, 40)),  # the crop holds the box
        ("normalized", [0.1, 0.1, 0.5, 0.5], (20, 10, 100, 50)),
        ("qwen1000", [100, 100, 500, 500], (20, 10, 100, 50)),
    ],
)
def test_boxes_convert_in_their_stated_convention(fmt, box, expected):
    assert to_pixels(box, fmt, 200, 100) == expected


def test_a_box_is_never_reinterpreted_in_another_convention():
    # VerlTool would read [0.1, 0.1, 0.5, 0.5] as normalized; here it is a 0.4-pixel box.
    with pytest.raises(BoxError, match="less than one pixel"):
        to_pixels([0.1, 0.1, 0.5, 0.5], "pixels", 200, 100)
    with pytest.raises(BoxError, match=r"bbox_format='normalized'.*\[0, 1\]"):
        to_pixels([10, 20, 30, 40], "normalized", 200, 100)
    with pytest.raises(BoxError, match=r"pixels.*\[0, 200\]"):
        to_pixels([150, 20, 250, 40], "pixels", 200, 100)


@pytest.mark.parametrize(
    "box, reason",
    [
        ([1, 2, 3], "4 numbers"),
        ("0,0,5,5", "4 numbers"),
        ([0, 0, "5", 5], "finite numbers"),
        ([0, 0, float("nan"), 5], "finite numbers"),
        ([0, 0, True, 5], "finite numbers"),
        ([5, 5, 5, 9], "zero area"),
        ([9, 5, 5, 9], "zero area"),
        ([-1, 0, 5, 5], "outside the image"),
    ],
)
def test_malformed_boxes_are_errors_for_the_agent(box, reason):
    with pytest.raises(BoxError, match=reason):
        to_pixels(box, "pixels", 200, 100)


def test_from_pixels_round_trips_and_formats_are_described():
    for fmt in ("pixels", "normalized", "qwen1000"):
        box = from_pixels((20, 10, 100, 50), fmt, 200, 100)
        assert to_pixels(box, fmt, 200, 100) == (20, 10, 100, 50)
        assert "[x1, y1, x2, y2]" in describe_format(fmt)
    with pytest.raises(InvalidConfigError, match="bbox_format must be one of"):
        describe_format("xywh")


def test_operations_return_new_read_only_arrays_and_cap_their_size():
    rng = np.random.default_rng(0)
    image = as_image_array(rng.integers(0, 256, size=(60, 80, 3), dtype=np.uint8))
    assert not image.flags.writeable
    piece = crop(image, (10, 5, 30, 25))
    assert piece.shape == (20, 20, 3) and np.array_equal(piece, image[5:25, 10:30])
    assert zoom(image, (10, 5, 30, 25), target=200).shape == (200, 200, 3)
    assert zoom(image, (0, 0, 80, 60), target=10_000).shape[1] == MAX_SIDE  # capped
    assert np.array_equal(rotate(image, 90), np.rot90(image))
    assert rotate(image, 45).shape[0] > 60  # the canvas grows to hold the corners
    assert np.array_equal(flip(image, "horizontal"), image[:, ::-1])
    gray = grayscale(image)
    assert np.array_equal(gray[..., 0], gray[..., 1])
    assert np.ptp(adjust_contrast(image, 0.0)) <= 1
    for out in (piece, gray, flip(image, "vertical")):
        assert not out.flags.writeable and out.dtype == np.uint8


@pytest.mark.parametrize("kind", SCENE_KINDS)
def test_scenes_are_deterministic_large_and_their_targets_are_small(kind):
    first, again = render_scene(kind, 7), render_scene(kind, 7)
    assert np.array_equal(first.image, again.image) and first.question == again.question
    assert not np.array_equal(first.image, render_scene(kind, 8).image)
    height, width = first.image.shape[:2]
    assert min(height, width) >= 1024
    assert first.answer in first.choices and len(set(first.choices)) == len(first.choices)
    for left, top, right, bottom in first.targets:
        assert 0 <= left < right <= width and 0 <= top < bottom <= height
        if kind != "count":  # the count's target is its (large) region
            assert (right - left) * (bottom - top) < 0.001 * width * height


def test_the_colour_target_is_the_only_saturated_pixels_of_its_colour():
    scene = render_scene("color", 3)
    rgb = np.array(COLOURS[scene.answer])
    close = np.abs(scene.image.astype(int) - rgb).sum(axis=2) < 30
    ys, xs = np.nonzero(close)
    left, top, right, bottom = scene.targets[0]
    assert len(xs) > 20
    assert xs.min() >= left and xs.max() < right and ys.min() >= top and ys.max() < bottom
