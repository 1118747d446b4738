"""The V* bench loader: layout, shuffled options, boxes, typed errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vt_envs.domains.visual.loaders import load_vstar
from vt_envs.domains.visual.tasks import LETTERS
from vt_envs.errors import DatasetFormatError


def _item(root, category, name, **meta):
    (root / category).mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8)).save(root / category / f"{name}.jpg")
    (root / category / f"{name}.json").write_text(json.dumps(meta))


def test_items_load_with_the_correct_option_shuffled_and_boxes_as_edges(tmp_path):
    for i in range(6):
        _item(
            tmp_path,
            "direct_attributes",
            f"sa_{i}",
            question="What is the colour of the cup?",
            options=["red", "blue", "green", "white"],
            bbox=[[10, 5, 20.5, 8]],
        )
    tasks = load_vstar(tmp_path, seed=3)
    golds = [t.gold for t in tasks]
    assert len(set(golds)) > 1  # the correct option is not always (A)
    for task in tasks:
        assert task.assets["choices"][LETTERS.index(task.gold)] == "red"
        assert task.assets["targets"] == [(10, 5, 31, 13)]
        assert task.assets["image_size"] == (60, 40)
        assert task.prompt.startswith(
            "<image>\n(Image 0: 60x40 pixels.)\nWhat is the colour of the cup?\n(A) "
        )
    assert [t.gold for t in load_vstar(tmp_path, seed=3)] == golds  # seeded


def test_layout_mistakes_are_typed_errors(tmp_path):
    with pytest.raises(DatasetFormatError, match="does not exist"):
        load_vstar(tmp_path / "nope")
    with pytest.raises(DatasetFormatError, match="no V\\* items"):
        load_vstar(tmp_path)
    _item(tmp_path, "relative_position", "a", question="q?")
    with pytest.raises(DatasetFormatError, match=r"missing \['options'\]"):
        load_vstar(tmp_path)


def test_an_unreadable_image_is_a_format_error(tmp_path):
    _item(tmp_path, "relative_position", "bad", question="q?", options=["a", "b"])
    (tmp_path / "relative_position" / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(DatasetFormatError, match="not a readable image"):
        load_vstar(tmp_path)
