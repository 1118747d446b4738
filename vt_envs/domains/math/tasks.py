"""VT-Math-v0's task source: the embedded generator, a user's dataset, or a ``TaskSource``.

The problems themselves come from :mod:`~vt_envs.domains.math.generator` (the
seeded embedded generator, :func:`math_tasks`) and
:mod:`~vt_envs.domains.math.loaders` (GSM8K, MATH, AIME/AMC, DeepMath, ToRL
files and ``"champ"``); :func:`math_task_source` picks one for an env's keywords.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from vt_envs.core.loaders import FieldMap
from vt_envs.core.task import TaskSource
from vt_envs.domains.math.generator import DIFFICULTIES, FAMILIES, math_tasks
from vt_envs.domains.math.loaders import DEFAULT_HOLDOUT, load_champ, load_math_dataset
from vt_envs.errors import InvalidConfigError

__all__ = ["DIFFICULTIES", "FAMILIES", "check_dataset", "math_task_source", "math_tasks"]


def check_dataset(dataset: object, holdout: float | None) -> None:
    """Refuse a ``dataset`` of no known kind, and a ``holdout`` for data with splits
    of its own (the embedded generator, a :class:`TaskSource`).

    Raises:
        InvalidConfigError: either.
    """
    if holdout is not None and not isinstance(dataset, (str, os.PathLike)):
        raise InvalidConfigError(
            f"holdout={holdout!r} splits user data (dataset=PATH or 'champ'); the embedded "
            "generator and a TaskSource have their own splits: drop holdout"
        )
    if not (dataset is None or isinstance(dataset, (str, os.PathLike, TaskSource))):
        raise InvalidConfigError(
            f"dataset must be None (the embedded generator), a file path, 'champ' or a "
            f"TaskSource, got {type(dataset).__name__}"
        )


def math_task_source(
    dataset: str | os.PathLike[str] | TaskSource | None,
    *,
    split: str,
    size: int | None,
    families: Sequence[str] | None,
    difficulty: Sequence[int] | int,
    dataset_layout: str | None,
    fields: FieldMap | None,
    limit: int | None,
    holdout: float | None,
    holdout_seed: int,
) -> TaskSource:
    """The task source ``dataset`` names (see :func:`check_dataset` for what it may be)."""
    check_dataset(dataset, holdout)
    kept = {"holdout": DEFAULT_HOLDOUT if holdout is None else holdout}
    if isinstance(dataset, TaskSource):
        return dataset
    if dataset is None:
        return math_tasks(split, size=size, families=families, difficulty=difficulty)
    if dataset == "champ":
        return load_champ(split=split, limit=limit, **kept)
    return load_math_dataset(
        dataset,
        layout=dataset_layout,
        fields=fields,
        split=split,
        limit=limit,
        holdout_seed=holdout_seed,
        **kept,
    )
