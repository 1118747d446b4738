"""Image-token counts match transformers' own Qwen2-VL image processor."""

from __future__ import annotations

import numpy as np
import pytest

from vt_envs.core.image_tokens import QWEN2_VL_DEFAULTS, ImageTokenSpec

transformers = pytest.importorskip("transformers")

SIZES = [(1024, 1024), (1254, 1282), (37, 45), (2048, 300), (10, 1000), (28, 28), (1536, 1024)]


@pytest.mark.parametrize("max_pixels", [256 * 28 * 28, 1280 * 28 * 28, 4096 * 28 * 28])
def test_grid_and_token_counts_match_the_processor(max_pixels):
    processor = transformers.Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels)
    spec = ImageTokenSpec(max_pixels=max_pixels)
    for height, width in SIZES:
        out = processor(images=[np.zeros((height, width, 3), dtype=np.uint8)], return_tensors="np")
        grid = tuple(int(v) for v in out["image_grid_thw"][0])
        assert spec.grid(height, width) == grid, (height, width)
        assert spec.tokens(height, width) * 4 == out["pixel_values"].shape[0]


def test_default_budget_of_a_scene():
    assert QWEN2_VL_DEFAULTS.tokens(1254, 1282) == 1260
    assert QWEN2_VL_DEFAULTS.resized(1254, 1282) == (980, 1008)


def test_a_small_label_is_a_few_pixels_tall_unless_zoomed():
    import statistics

    from vt_envs.domains.visual.ops import zoom
    from vt_envs.domains.visual.scenes import render_scene

    seen, zoomed = [], []
    for seed in range(12):
        scene = render_scene("label", seed)
        height, width = scene.image.shape[:2]
        left, top, right, bottom = scene.targets[0]
        glyphs = bottom - top - 8  # the tag's text, without its 4-pixel padding
        seen.append(QWEN2_VL_DEFAULTS.seen_height(glyphs, height, width))
        crop = zoom(scene.image, scene.target_union(margin=24))
        zoomed.append(glyphs * crop.shape[0] / (bottom - top + 48))
    assert statistics.median(seen) < 8  # at the default 1280-token budget
    assert min(zoomed) > 40
