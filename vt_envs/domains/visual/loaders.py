"""Image QA sets for VT-Visual-v0: the V* bench layout, and easy-VQA.

V* bench (``vstar_bench``): one directory per category (``direct_attributes``,
``relative_position``), and per item an image ``NAME.jpg`` (or ``.png``) with
``NAME.json`` holding ``question``, ``options`` (the correct one listed
first) and the target boxes as ``[x, y, w, h]`` pixels (``bbox``, one box or
a list of boxes). The loader shuffles the options with the seed, so the
correct letter is not always (A), and keeps the boxes (converted to
``(left, top, right, bottom)``) for oracles and crop checks. Images are read
when an episode opens, not at load time.

easy-VQA (PyPI ``easy-vqa``, the ``visual`` extra): 64x64 images of one
coloured shape with open questions ("what color is the shape?", yes/no), a
low-resolution set where no zoom is needed — a sanity check for a VLM policy.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from vt_envs.core.task import Task, TaskList
from vt_envs.domains.visual.tasks import LETTERS, size_caption
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = ["easy_vqa_available", "load_easy_vqa", "load_vstar"]

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _boxes(raw: object, where: Path) -> list[tuple[int, int, int, int]]:
    if raw is None:
        return []
    boxes = raw if raw and isinstance(raw[0], (list, tuple)) else [raw]
    out = []
    for box in boxes:
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise DatasetFormatError(f"{where}: a target box must be [x, y, w, h], got {box!r}")
        x, y, w, h = (float(v) for v in box)
        out.append((int(x), int(y), int(np.ceil(x + w)), int(np.ceil(y + h))))
    return out


def load_vstar(root: str | os.PathLike[str], *, seed: int = 0, split: str = "test") -> TaskList:
    """V* bench items under ``root`` as multiple-choice tasks (see the module docstring)."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetFormatError(f"V* bench directory {str(root)!r} does not exist")
    tasks = []
    for meta_path in sorted(root.glob("*/*.json")):
        image_path = next(
            (p for p in (meta_path.with_suffix(s) for s in _IMAGE_SUFFIXES) if p.is_file()), None
        )
        if image_path is None:
            raise DatasetFormatError(f"{meta_path}: no image next to it ({_IMAGE_SUFFIXES})")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DatasetFormatError(f"{meta_path}: not valid JSON ({exc})") from None
        missing = [k for k in ("question", "options") if k not in meta]
        if missing:
            raise DatasetFormatError(f"{meta_path}: missing {missing}; it has {sorted(meta)}")
        options = [str(o) for o in meta["options"]]
        if len(options) < 2:
            raise DatasetFormatError(f"{meta_path}: needs at least 2 options, got {options}")
        task_id = f"vstar/{meta_path.parent.name}/{meta_path.stem}"
        order = np.random.default_rng([seed, len(tasks)]).permutation(len(options))
        shuffled = [options[i] for i in order]
        lines = "\n".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(shuffled))
        try:
            with Image.open(image_path) as image:  # reads the header only
                width, height = image.size
        except OSError as exc:  # UnidentifiedImageError included
            raise DatasetFormatError(f"{image_path}: not a readable image ({exc})") from None
        head = f"<image>\n{size_caption(width, height)}\n{meta['question']}"
        tasks.append(
            Task(
                id=task_id,
                prompt=f"{head}\n{lines}\nAnswer with the option's letter.",
                gold=LETTERS[shuffled.index(options[0])],
                metadata={"kind": meta_path.parent.name, "form": "choice", "source": "vstar"},
                assets={
                    "image_paths": [str(image_path)],
                    "choices": shuffled,
                    "targets": _boxes(meta.get("bbox", meta.get("target_boxes")), meta_path),
                    "image_size": (width, height),
                },
            )
        )
    if not tasks:
        raise DatasetFormatError(f"no V* items (CATEGORY/NAME.json + image) under {str(root)!r}")
    return TaskList(tasks, name="vstar", split=split)


def easy_vqa_available() -> bool:
    """Whether the ``easy-vqa`` package (the ``visual`` extra) is installed."""
    return importlib.util.find_spec("easy_vqa") is not None


def load_easy_vqa(split: str = "test", *, size: int | None = None) -> TaskList:
    """easy-VQA's questions as open-form tasks (its data files, read without importing it).

    ``split``: ``"train"`` (38,575 questions on 4,000 images) or ``"test"``
    (9,673 on 1,000); ``size`` keeps the first ``size``.
    """
    if split not in ("train", "test"):
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    spec = importlib.util.find_spec("easy_vqa")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidConfigError(
            "dataset='easy-vqa' needs the easy-vqa package: pip install 'vt-envs[visual]'"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / split
    rows = json.loads((data / "questions.json").read_text(encoding="utf-8"))
    tasks = []
    for index, (question, answer, image_id) in enumerate(rows[:size]):
        tasks.append(
            Task(
                id=f"easy-vqa/{split}/{index}",
                prompt=f"<image>\n{size_caption(64, 64)}\n{question}\nAnswer with one word.",
                gold=str(answer),
                metadata={"kind": "easy_vqa", "form": "open", "source": "easy-vqa"},
                assets={
                    "image_paths": [str(data / "images" / f"{image_id}.png")],
                    "choices": [],
                    "image_size": (64, 64),
                },
            )
        )
    return TaskList(tasks, name="easy-vqa", split=split)
