"""VT-Lookup-v0's tasks: seeded tables of digit keys and values, one key asked."""

from __future__ import annotations

import numpy as np

from vt_envs.core.task import GeneratedTasks, Task
from vt_envs.errors import InvalidConfigError

__all__ = ["lookup_tasks"]

_SPLIT_STREAM = {"train": 0, "test": 1}


def lookup_tasks(
    split: str = "train",
    *,
    size: int | None = None,
    num_keys: int = 6,
    key_digits: int = 3,
    value_digits: int = 3,
) -> GeneratedTasks:
    """The seeded task source of VT-Lookup-v0 (train: 10,000 tasks; test: 500).

    Train and test draw from different random streams, so held-out tables
    and questions are new to a policy trained on the train split.
    """
    if split not in _SPLIT_STREAM:
        raise InvalidConfigError(f"split must be one of {list(_SPLIT_STREAM)}, got {split!r}")
    if num_keys > 10**key_digits:
        raise InvalidConfigError(
            f"num_keys={num_keys} distinct keys do not fit in {key_digits} digits"
        )

    def generate(split: str, index: int) -> Task:
        rng = np.random.default_rng([_SPLIT_STREAM[split], index, num_keys, key_digits])
        keys = rng.choice(10**key_digits, size=num_keys, replace=False)
        values = rng.integers(0, 10**value_digits, size=num_keys)
        table = {f"{k:0{key_digits}d}": f"{v:0{value_digits}d}" for k, v in zip(keys, values)}
        key = list(table)[int(rng.integers(num_keys))]
        return Task(
            id=f"lookup/{split}/{index}",
            prompt=f"What is the value of key {key}?",
            gold=table[key],
            metadata={"key": key},
            assets={"table": table},
        )

    default_size = 10_000 if split == "train" else 500
    return GeneratedTasks(generate, size or default_size, name="lookup", split=split)
