"""Tasks and the sources that yield them.

A :class:`Task` is one episode's problem: the prompt the agent sees, the gold
answer only the verifier sees, metadata, and assets the tools need (a
database path, images, a repository). A :class:`TaskSource` is an indexable,
finite collection of tasks for one split; the env draws indices from it with
its seeded RNG, so the same seed gives the same task sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vt_envs.errors import InvalidConfigError, UnknownTaskError

__all__ = ["SPLITS", "GeneratedTasks", "Task", "TaskList", "TaskSource"]

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Task:
    """One problem.

    Attributes:
        id: unique within its source (stable across runs: ``"sql/test/17"``).
        prompt: the question as shown to the agent (the env adds the system
            prompt and tool descriptions around it).
        gold: what the verifier compares against. Never shown to the agent
            and never put in ``info``.
        metadata: free-form, JSON-friendly facts (difficulty, source, db_id).
            Returned in ``info["task"]``, so it must not leak the gold.
        assets: what tools need for this task (paths, tables, images).
    """

    id: str
    prompt: str
    gold: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    assets: Mapping[str, Any] = field(default_factory=dict)


class TaskSource(Sequence[Task]):
    """A finite, indexable collection of tasks of one split.

    Subclasses implement ``__len__`` and ``_load(index)``; lookup by id and
    caching are shared here.
    """

    name: str = "tasks"
    split: str = "train"

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _load(self, index: int) -> Task:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getitem__(self, index: int) -> Task:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError(f"task index must be an int, got {type(index).__name__}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"task index {index} out of range for {n} tasks in {self.name!r}")
        return self._load(index % n)

    def __iter__(self) -> Iterator[Task]:
        return (self[i] for i in range(len(self)))

    def ids(self) -> list[str]:
        return [task.id for task in self]

    def get(self, task_id: str) -> Task:
        """Return the task whose id is ``task_id``; raises :class:`UnknownTaskError`."""
        task = self.find(task_id)
        if task is None:
            raise UnknownTaskError(task_id, f"{self.name}/{self.split}", self._index_of())
        return task

    def find(self, task_id: str, *, scan: bool = True) -> Task | None:
        """The task whose id is ``task_id``, or ``None``. ``scan=False``: only what the
        source resolves without making or loading its other tasks (a generated source of
        10**9 tasks must not be generated to look up an id a tool server's client sent)."""
        if not scan and getattr(self, "_id_index", None) is None:
            return None
        index = self._index_of().get(task_id)
        return None if index is None else self[index]

    def _index_of(self) -> dict[str, int]:
        cached = getattr(self, "_id_index", None)
        if cached is None:
            cached = {task.id: i for i, task in enumerate(self)}
            self._id_index = cached
        return cached

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, split={self.split!r}, size={len(self)})"


class TaskList(TaskSource):
    """Tasks held in memory (loaded from a file or written inline)."""

    def __init__(self, tasks: Iterable[Task], *, name: str = "tasks", split: str = "train"):
        self._tasks = list(tasks)
        if not self._tasks:
            raise InvalidConfigError(
                f"task source {name!r} ({split}) is empty; give at least one task"
            )
        ids = [t.id for t in self._tasks]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise InvalidConfigError(f"task ids must be unique in {name!r}; duplicated: {dupes}")
        self.name, self.split = name, split

    def __len__(self) -> int:
        return len(self._tasks)

    def _load(self, index: int) -> Task:
        return self._tasks[index]

    def find(self, task_id: str, *, scan: bool = True) -> Task | None:
        # Held in memory: indexing every id is cheap, so a lookup always may.
        return super().find(task_id, scan=True)


class GeneratedTasks(TaskSource):
    """Tasks made on demand by a pure function of their index.

    ``generate(split, index)`` must be deterministic: the same arguments give
    the same task on every machine. Generated tasks are cached.
    """

    def __init__(
        self,
        generate: Callable[[str, int], Task],
        size: int,
        *,
        name: str,
        split: str = "train",
    ):
        if split not in SPLITS:
            raise InvalidConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if size <= 0:
            raise InvalidConfigError(f"size must be > 0, got {size}")
        self._generate, self._size = generate, int(size)
        self._cache: dict[int, Task] = {}
        self.name, self.split = name, split

    def __len__(self) -> int:
        return self._size

    def _load(self, index: int) -> Task:
        task = self._cache.get(index)
        if task is None:
            task = self._cache[index] = self._generate(self.split, index)
        return task

    def find(self, task_id: str, *, scan: bool = True) -> Task | None:
        """Like :meth:`TaskSource.find`; ids of the conventional form
        ``"{name}/{split}/{index}"`` resolve without generating the whole split."""
        prefix = f"{self.name}/{self.split}/"
        suffix = task_id[len(prefix) :] if task_id.startswith(prefix) else ""
        index = int(suffix) if suffix.isdigit() and len(suffix) <= 18 else len(self)
        if index < len(self) and self[index].id == task_id:
            return self[index]
        return super().find(task_id, scan=scan)
