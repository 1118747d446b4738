"""Visual tasks: seeded, no pixels held, disjoint splits, letters scored right."""

from __future__ import annotations

import pytest

from vt_envs.core.task import Task
from vt_envs.domains.visual.scenes import SCENE_KINDS
from vt_envs.domains.visual.tasks import LETTERS, scene_of, visual_tasks
from vt_envs.domains.visual.verifier import ChoiceMatch
from vt_envs.errors import InvalidConfigError


def test_tasks_are_seeded_hold_no_pixels_and_rotate_kinds():
    tasks = visual_tasks("test", size=8)
    again = visual_tasks("test", size=8)
    assert [t.prompt for t in tasks] == [t.prompt for t in again]
    assert [tasks[i].metadata["kind"] for i in range(4)] == list(SCENE_KINDS)
    for task in tasks:
        assert all(not hasattr(v, "shape") for v in task.assets.values())  # no arrays
        kind, seed = task.assets["scene"]
        scene = scene_of(kind, seed)
        assert task.assets["choices"][LETTERS.index(task.gold)] == scene.answer
        height, width = scene.image.shape[:2]
        assert task.prompt.startswith(
            f"<image>\n(Image 0: {width}x{height} pixels.)\n{scene.question}"
        )


def test_train_and_test_scenes_never_coincide():
    train = {visual_tasks("train", size=50)[i].assets["scene"] for i in range(50)}
    test = {visual_tasks("test", size=50)[i].assets["scene"] for i in range(50)}
    assert not train & test


def test_choice_match_accepts_the_letter_forms_and_the_option_text():
    task = Task("t", "q", gold="B", assets={"choices": ["red", "blue", "green", "cyan"]})
    score = ChoiceMatch()
    for answer in ("B", "(B)", " B) blue", "b".upper(), "Blue", "blue."):
        assert score(task, answer).value == 1.0, answer
    for answer in ("A", "red", "Blue-green", "Bb"):
        assert score(task, answer).value == 0.0, answer
    open_task = Task("o", "q", gold="K7QX", assets={"choices": []})
    assert score(open_task, " k7qx ").value == 1.0 and score(open_task, "K7Q").value == 0.0


def test_open_form_and_bad_options():
    task = visual_tasks("test", size=4, multiple_choice=False)[1]
    assert task.gold == scene_of(*task.assets["scene"]).answer
    with pytest.raises(InvalidConfigError):
        visual_tasks("val")
    with pytest.raises(InvalidConfigError):
        visual_tasks("test", kinds="color")
