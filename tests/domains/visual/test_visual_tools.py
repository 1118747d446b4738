"""Image tools: images by index, results appended, every argument mistake an observation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vt_envs.domains.visual.ops import as_image_array
from vt_envs.domains.visual.tools import (
    MAX_IMAGES,
    ContrastTool,
    CropTool,
    FlipTool,
    ImageSession,
    RotateTool,
    ZoomTool,
)


def _bound(tool, image):
    session = ImageSession([as_image_array(image)])
    tool.bind(lambda task: session)
    return asyncio.run(tool.open_session(None, seed=0))


def _call(tool, session, **arguments):
    return asyncio.run(tool.call(session, arguments, timeout_s=5))


@pytest.fixture
def image():
    return np.random.default_rng(0).integers(0, 256, size=(100, 200, 3), dtype=np.uint8)


def test_a_crop_becomes_the_next_image_and_can_be_cropped_again(image):
    crop = CropTool()
    session = _bound(crop, image)
    first = _call(crop, session, bbox=[10, 20, 110, 70], image=0)
    assert first.ok and first.text == "Image 1: 100x50 pixels."
    assert np.array_equal(first.images[0], image[20:70, 10:110])
    second = _call(crop, session, bbox=[0, 0, 10, 10], image=1)
    assert np.array_equal(second.images[0], image[20:30, 10:20])
    assert len(session.images) == 3 and session.images[1] is first.images[0]  # by reference


@pytest.mark.parametrize(
    "arguments, error",
    [
        ({"bbox": [0, 0, 300, 50]}, "outside the image"),
        ({"bbox": [5, 5, 5, 50]}, "zero area"),
        ({"bbox": [0, 0, "9", 9]}, "finite numbers"),
        ({"bbox": [0, 0, 9, 9], "image": 3}, "no image 3"),
        ({"bbox": [0, 0, 9, 9], "image": True}, "integer index"),
    ],
)
def test_argument_mistakes_are_observations(image, arguments, error):
    crop = CropTool()
    session = _bound(crop, image)
    result = _call(crop, session, **arguments)
    assert not result.ok and result.error == "bad_arguments" and error in result.text
    assert len(session.images) == 1


def test_the_convention_in_force_is_named_and_used(image):
    zoom = ZoomTool(bbox_format="normalized", target=300)
    session = _bound(zoom, image)
    assert "bbox_format='normalized'" in _call(zoom, session, bbox=[10, 10, 50, 50]).text
    result = _call(zoom, session, bbox=[0.0, 0.0, 0.5, 0.5])
    assert result.ok and result.images[0].shape == (150, 300, 3)


def test_other_operations_and_the_image_cap(image):
    rotate, flip, contrast = RotateTool(), FlipTool(), ContrastTool()
    session = _bound(rotate, image)
    for tool in (flip, contrast):
        tool.bind(lambda task: session)
    assert _call(rotate, session, degrees=90).images[0].shape == (200, 100, 3)
    assert np.array_equal(
        _call(flip, session, direction="horizontal", image=0).images[0], image[:, ::-1]
    )
    assert not _call(contrast, session, factor=float("inf")).ok
    while len(session.images) < MAX_IMAGES:
        _call(flip, session, direction="vertical", image=0)
    capped = _call(flip, session, direction="vertical", image=0)
    assert not capped.ok and capped.error == "too_many_images"
