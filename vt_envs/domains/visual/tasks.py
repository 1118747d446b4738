"""VT-Visual-v0's tasks: generated scenes, multiple-choice or open, with a fixed held-out split.

A task holds no pixels: its assets name the scene (``kind``, ``seed``), and
the image is rendered when an episode opens (:func:`scene_of`, cached per
process, so every holder shares one array). The prompt states the image's
size (a policy that sees a resized image needs it to give pixel boxes); the
assets keep the target boxes for oracles and crop checks. Train and test draw seeds from
disjoint streams (even and odd), so no held-out scene is ever trained on.

Multiple choice: the choices are shuffled with the task's seed and lettered
``(A)``…; the gold is the letter, and :class:`ChoiceMatch` also accepts the
option's text. Open form: the gold is the answer text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np
from PIL import Image

from vt_envs.core.task import GeneratedTasks, Task
from vt_envs.core.verifier import Score
from vt_envs.domains.visual.ops import as_image_array
from vt_envs.domains.visual.scenes import SCENE_KINDS, Scene, render_scene
from vt_envs.errors import InvalidConfigError

__all__ = ["LETTERS", "ChoiceMatch", "images_of_task", "scene_of", "size_caption", "visual_tasks"]

LETTERS = "ABCDEFGH"
_SPLIT_OFFSET = {"train": 0, "test": 1}
_LETTER = re.compile(r"^\s*\(?([A-H])\)?(?:[\s.:)]|$)")


@functools.lru_cache(maxsize=16)
def scene_of(kind: str, seed: int) -> Scene:
    """The rendered scene of a task (cached: the generator and the episode share it)."""
    return render_scene(kind, seed)


@functools.lru_cache(maxsize=16)
def _read_image(path: str) -> np.ndarray:
    with Image.open(path) as image:
        return as_image_array(image)


def images_of_task(task: Task) -> tuple[np.ndarray, ...]:
    """A task's images (read-only arrays): its generated scene, the files named in
    ``assets["image_paths"]`` (read when the episode opens; the last 16 cached), or
    the arrays in ``assets["images"]``."""
    assets = task.assets
    if "scene" in assets:
        return (scene_of(*assets["scene"]).image,)
    if "image_paths" in assets:
        return tuple(_read_image(str(path)) for path in assets["image_paths"])
    if "images" in assets:
        return tuple(as_image_array(image) for image in assets["images"])
    raise InvalidConfigError(
        f"task {task.id!r} has no image: a visual task's assets need 'scene', 'image_paths' "
        f"or 'images'; it has {sorted(assets)}"
    )


def size_caption(width: int, height: int) -> str:
    """How a prompt states a task image's size."""
    return f"(Image 0: {width}x{height} pixels.)"


def _options(scene: Scene, seed: int) -> tuple[list[str], str]:
    order = np.random.default_rng([seed, 7]).permutation(len(scene.choices))
    options = [scene.choices[i] for i in order]
    return options, LETTERS[options.index(scene.answer)]


def visual_tasks(
    split: str = "train",
    *,
    kinds: Sequence[str] = SCENE_KINDS,
    size: int | None = None,
    multiple_choice: bool = True,
) -> GeneratedTasks:
    """The seeded task source (train: 10,000 tasks; test: 200), kinds in rotation."""
    if split not in _SPLIT_OFFSET:
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(kinds, str) or not kinds or not all(k in SCENE_KINDS for k in kinds):
        raise InvalidConfigError(f"kinds must be a list from {list(SCENE_KINDS)}, got {kinds!r}")
    kinds = tuple(kinds)

    def generate(split: str, index: int) -> Task:
        kind = kinds[index % len(kinds)]
        seed = 2 * index + _SPLIT_OFFSET[split]
        scene = scene_of(kind, seed)
        height, width = scene.image.shape[:2]
        head = f"<image>\n{size_caption(width, height)}\n{scene.question}"
        if multiple_choice:
            options, gold = _options(scene, seed)
            lines = "\n".join(f"({LETTERS[i]}) {option}" for i, option in enumerate(options))
            prompt = f"{head}\n{lines}\nAnswer with the option's letter."
            choices = options
        else:
            prompt, gold, choices = head, scene.answer, []
        return Task(
            id=f"visual/{split}/{index}",
            prompt=prompt,
            gold=gold,
            metadata={"kind": kind, "form": "choice" if multiple_choice else "open"},
            assets={
                "scene": (kind, seed),
                "choices": choices,
                "targets": scene.targets,
                "image_size": (width, height),
            },
        )

    default = 10_000 if split == "train" else 200
    return GeneratedTasks(generate, size or default, name="visual", split=split)


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


class ChoiceMatch:
    """Scores a letter (``"B"``, ``"(B)"``, ``"B) blue"``) or an option's text against the gold
    letter; in the open form, the normalized answer against the gold text."""

    inline = True  # a letter or a normalized string compared: the env calls it directly

    def __call__(self, task: Task, answer: str) -> Score:
        choices = list(task.assets.get("choices", ()))
        gold = str(task.gold)
        if choices:
            match = _LETTER.match(answer)
            given = match.group(1) if match else None
            if given is None:
                texts = {_normalize(c): LETTERS[i] for i, c in enumerate(choices)}
                given = texts.get(_normalize(answer))
            value = float(given == gold)
        else:
            value = float(_normalize(answer) == _normalize(gold))
        return Score(value, {"correct": value}, "" if value else f"expected {gold!r}")
