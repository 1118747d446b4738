"""VT-Visual-v0's tasks: generated scenes, multiple-choice or open, with a fixed held-out split.

A task holds no pixels: its assets name the scene (``kind``, ``seed``). It is
written from the scene's plan (:func:`~vt_envs.domains.visual.scenes.describe_scene`,
no drawing), and the image is rendered when an episode opens. Decoded images
are cached only by a :class:`TaskImages` that an env owns (its image tools
read through it, so an episode that opens the same task again renders
nothing): it keeps the last few, and the env's ``close()`` empties it.
Nothing is cached per process. The prompt states the image's size (a policy
that sees a resized image needs it to give pixel boxes); the assets keep the
target boxes for oracles and crop checks. Train and test draw seeds from
disjoint streams (even and odd), so no held-out scene is ever trained on.

Multiple choice: the choices are shuffled with the task's seed and lettered
``(A)``…; the gold is the letter, and
:class:`~vt_envs.domains.visual.verifier.ChoiceMatch` also accepts the option's
text. Open form: the gold is the answer text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np
from PIL import Image

from vt_envs.core.task import GeneratedTasks, Task
from vt_envs.domains.visual.ops import as_image_array
from vt_envs.domains.visual.scenes import (
    SCENE_KINDS,
    Scene,
    SceneSpec,
    describe_scene,
    render_scene,
)
from vt_envs.errors import InvalidConfigError

__all__ = [
    "LETTERS",
    "TaskImages",
    "images_of_task",
    "scene_of",
    "size_caption",
    "visual_tasks",
]

LETTERS = "ABCDEFGH"
_SPLIT_OFFSET = {"train": 0, "test": 1}


def scene_of(kind: str, seed: int) -> Scene:
    """The rendered scene of a task (rendered anew each call; see :class:`TaskImages`)."""
    return render_scene(kind, seed)


def _read_image(path: str) -> np.ndarray:
    with Image.open(path) as image:
        return as_image_array(image)


class TaskImages:
    """Decoded task images (scenes and image files), the ``size`` most recent kept.

    One belongs to one env: its image tools load an episode's images through
    it (calling the object is :func:`images_of_task` through this cache), an
    episode that opens a task again finds its scene here, and the env's
    ``close()`` calls :meth:`clear`. So an env holds a bounded
    number of decoded images however long it runs, and none after it closes.
    """

    def __init__(self, size: int = 2):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidConfigError(f"size must be an int >= 1, got {size!r}")
        self.size = size
        self._items: OrderedDict[Hashable, object] = OrderedDict()

    def _get(self, key: Hashable, make: Callable[[], object]) -> object:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        self._items[key] = value
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def scene(self, kind: str, seed: int) -> Scene:
        return self._get(("scene", kind, seed), lambda: render_scene(kind, seed))

    def file(self, path: str) -> np.ndarray:
        return self._get(("file", path), lambda: _read_image(path))

    def __call__(self, task: Task) -> tuple[np.ndarray, ...]:
        return images_of_task(task, self)

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Drop every image kept (the env closes)."""
        self._items.clear()


def images_of_task(task: Task, cache: TaskImages | None = None) -> tuple[np.ndarray, ...]:
    """A task's images (read-only arrays): its generated scene, the files named in
    ``assets["image_paths"]`` (read when the episode opens), or the arrays in
    ``assets["images"]``; decoded through ``cache`` when one is given, else anew."""
    assets = task.assets
    if "scene" in assets:
        kind, seed = assets["scene"]
        return ((cache.scene(kind, seed) if cache else scene_of(kind, seed)).image,)
    if "image_paths" in assets:
        paths = [str(path) for path in assets["image_paths"]]
        return tuple(cache.file(path) if cache else _read_image(path) for path in paths)
    if "images" in assets:
        return tuple(as_image_array(image) for image in assets["images"])
    raise InvalidConfigError(
        f"task {task.id!r} has no image: a visual task's assets need 'scene', 'image_paths' "
        f"or 'images'; it has {sorted(assets)}"
    )


def size_caption(width: int, height: int) -> str:
    """How a prompt states a task image's size."""
    return f"(Image 0: {width}x{height} pixels.)"


def _options(scene: SceneSpec, seed: int) -> tuple[list[str], str]:
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
    """The seeded task source (train: 10,000 tasks; test: 200), kinds in rotation.

    A task is written from its scene's plan, without drawing it (well under a
    millisecond); the image is rendered when an episode opens the task.
    """
    if split not in _SPLIT_OFFSET:
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(kinds, str) or not kinds or not all(k in SCENE_KINDS for k in kinds):
        raise InvalidConfigError(f"kinds must be a list from {list(SCENE_KINDS)}, got {kinds!r}")
    kinds = tuple(kinds)

    def generate(split: str, index: int) -> Task:
        kind = kinds[index % len(kinds)]
        seed = 2 * index + _SPLIT_OFFSET[split]
        scene = describe_scene(kind, seed)
        width, height = scene.size
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
