"""Task sources: indexing, lookup by id, generated tasks are deterministic and cached."""

from __future__ import annotations

import pytest

from vt_envs import GeneratedTasks, Task, TaskList
from vt_envs.errors import InvalidConfigError, UnknownTaskError


def gen(split: str, index: int) -> Task:
    return Task(id=f"{split}/{index}", prompt=f"p{index}", gold=index * index)


def test_generated_tasks_are_pure_and_cached():
    a, b = GeneratedTasks(gen, 10, name="g"), GeneratedTasks(gen, 10, name="g")
    assert [t.gold for t in a] == [t.gold for t in b] == [i * i for i in range(10)]
    assert a[3] is a[3]
    assert a.get("train/7").gold == 49
    assert a[-1].id == "train/9"
    with pytest.raises(IndexError, match="out of range for 10 tasks"):
        a[10]


def test_task_list_rejects_empty_and_duplicates():
    with pytest.raises(InvalidConfigError, match="is empty"):
        TaskList([], name="e")
    with pytest.raises(InvalidConfigError, match=r"duplicated: \['a'\]"):
        TaskList([Task("a", "p"), Task("a", "q")], name="d")


def test_unknown_task_id_suggests():
    tasks = TaskList([Task("sql/1", "p"), Task("sql/2", "q")], name="s")
    with pytest.raises(UnknownTaskError, match="Did you mean 'sql/1'"):
        tasks.get("sql/11")


def test_bad_split_for_generated():
    with pytest.raises(InvalidConfigError, match="split must be one of"):
        GeneratedTasks(gen, 3, name="g", split="dev")


def test_conventional_ids_resolve_without_generating_the_split():
    calls = []

    def counting(split: str, index: int) -> Task:
        calls.append(index)
        return Task(id=f"g/{split}/{index}", prompt="p")

    tasks = GeneratedTasks(counting, 10_000, name="g")
    assert tasks.get("g/train/9876").id == "g/train/9876"
    assert calls == [9876]
