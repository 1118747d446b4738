"""Image QA sets users bring to VT-Visual-v0: the V* bench layout.

V* bench (``vstar_bench``): one directory per category (``direct_attributes``,
``relative_position``), and per item an image ``NAME.jpg`` (or ``.png``) with
``NAME.json`` holding ``question``, ``options`` (the correct one listed
first) and the target boxes as ``[x, y, w, h]`` pixels (``bbox``, one box or
a list of boxes). The loader shuffles the options with the seed, so the
correct letter is not always (A), and keeps the boxes (converted to
``(left, top, right, bottom)``) for oracles and crop checks. Images are read
when an episode opens, not at load time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from vt_envs.core.task import Task, TaskList
from vt_envs.domains.visual.tasks import LETTERS
from vt_envs.errors import DatasetFormatError

__all__ = ["load_vstar"]

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
        tasks.append(
            Task(
                id=task_id,
                prompt=f"<image>\n{meta['question']}\n{lines}\nAnswer with the option's letter.",
                gold=LETTERS[shuffled.index(options[0])],
                metadata={"kind": meta_path.parent.name, "form": "choice", "source": "vstar"},
                assets={
                    "image_paths": [str(image_path)],
                    "choices": shuffled,
                    "targets": _boxes(meta.get("bbox", meta.get("target_boxes")), meta_path),
                },
            )
        )
    if not tasks:
        raise DatasetFormatError(f"no V* items (CATEGORY/NAME.json + image) under {str(root)!r}")
    return TaskList(tasks, name="vstar", split=split)
