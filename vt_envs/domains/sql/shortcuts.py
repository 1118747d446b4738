"""Shortcut policies of VT-SQL-v0: answers that never look at the database.

- :class:`ConstantQueryPolicy` answers one fixed query at once: the empty
  query (:data:`EMPTY_QUERY`, no rows; it scores on any gold whose result is
  empty, which the question bank and the Spider loader both refuse), or a
  constant such as ``SELECT 0``.
- :class:`MostCommonAnswerPolicy` answers, as constants, the gold result
  seen most often for the task's question template (the wording tells the
  template; a template unseen in its table falls back to the database's most
  common result). :func:`fit_most_common` builds its table from train tasks.

Played on held-out tasks these are the surface baselines a benchmark must
keep near zero; ``tests/domains/sql/test_sql_shortcuts.py`` holds them
there through ``gym.make``, and ``python -m vt_envs.domains.sql.shortcuts``
prints the figures docs/envs/sql.md reports, with the distinct-question counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vt_envs.core.policy import Policy, run_episode
from vt_envs.core.task import Task
from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.execution import execute_query
from vt_envs.domains.sql.questions import sql_str

__all__ = [
    "EMPTY_QUERY",
    "ConstantQueryPolicy",
    "MostCommonAnswerPolicy",
    "answer_query",
    "distinct_questions",
    "empty_query_shortcut",
    "fit_most_common",
    "most_common_shortcut",
]

#: VT-SQL-v0's default ``databases=``.
DEFAULT_DATABASES = ("flights", "tpch", "shop")
#: A query with one column and no rows.
EMPTY_QUERY = "SELECT 1 AS x WHERE FALSE"


class ConstantQueryPolicy(Policy):
    """Answers ``sql`` on the first turn, whatever the task."""

    def __init__(self, sql: str = EMPTY_QUERY):
        self.sql = sql

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<answer>{self.sql}</answer>"


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float, decimal.Decimal)):
        return repr(float(value)) if isinstance(value, decimal.Decimal) else repr(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP {sql_str(value.isoformat(sep=' '))}"
    if isinstance(value, dt.date):
        return f"DATE {sql_str(value.isoformat())}"
    return sql_str(str(value))


def answer_query(rows: Sequence[Sequence[Any]]) -> str:
    """A query returning exactly ``rows`` (as constants); :data:`EMPTY_QUERY` for none."""
    if not rows:
        return EMPTY_QUERY
    if len(rows) == 1:
        return "SELECT " + ", ".join(_literal(v) for v in rows[0])
    values = ", ".join("(" + ", ".join(_literal(v) for v in row) + ")" for row in rows)
    return f"SELECT * FROM (VALUES {values})"


def _gold_rows(task: Task) -> tuple[tuple, ...]:
    con = connect_readonly(task.assets["db_path"])
    try:
        outcome = execute_query(con, str(task.gold), timeout_s=30.0)
    finally:
        con.close()
    return tuple(tuple(row) for row in outcome.rows) if outcome.ok else ()


def fit_most_common(tasks: Iterable[Task]) -> dict[str, str]:
    """``{template or "db:<db_id>": answer query}``: the most common gold result of each
    template, and of each database, over ``tasks`` (ties: the result seen first)."""
    by_key: dict[str, Counter] = {}
    for task in tasks:
        rows = _gold_rows(task)
        keys = [f"db:{task.metadata.get('db_id', '')}"]
        if "template" in task.metadata:
            keys.append(str(task.metadata["template"]))
        for key in keys:
            by_key.setdefault(key, Counter())[rows] += 1
    return {key: answer_query(counts.most_common(1)[0][0]) for key, counts in by_key.items()}


class MostCommonAnswerPolicy(Policy):
    """Answers at once the most common train result of the task's template (``table`` from
    :func:`fit_most_common`); an unseen template: its database's; else the empty query.
    It reads the task's template and database, never its gold."""

    def __init__(self, table: Mapping[str, str]):
        self.table = dict(table)

    def reset(self, task: Task) -> None:
        template = str(task.metadata.get("template", ""))
        db = f"db:{task.metadata.get('db_id', '')}"
        self.sql = self.table.get(template) or self.table.get(db) or EMPTY_QUERY

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<answer>{self.sql}</answer>"


@functools.lru_cache(maxsize=4)
def _fitted(databases: tuple[str, ...], per_database: int) -> dict[str, str]:
    from vt_envs.domains.sql.tasks import sql_tasks

    train = sql_tasks("train", databases=databases, size_per_database=per_database)
    return fit_most_common(train[i] for i in range(len(train)))


def most_common_shortcut(env: Any = None, per_database: int = 1000) -> MostCommonAnswerPolicy:
    """:class:`MostCommonAnswerPolicy` fitted on ``per_database`` train tasks of each of
    VT-SQL-v0's default databases (fitted once per process)."""
    return MostCommonAnswerPolicy(_fitted(DEFAULT_DATABASES, per_database))


def empty_query_shortcut(env: Any = None) -> ConstantQueryPolicy:
    """:class:`ConstantQueryPolicy` with the empty query."""
    return ConstantQueryPolicy()


def distinct_questions(split: str, size: int, database: str) -> int:
    """How many distinct question texts the first ``size`` tasks of ``split`` hold on
    ``database`` (an embedded database's name)."""
    from vt_envs.domains.sql.tasks import sql_tasks

    tasks = sql_tasks(split, databases=(database,), size_per_database=size)
    return len({tasks[i].prompt for i in range(size)})


def _score(env_kwargs: Mapping[str, Any], policy: Policy, n: int) -> float:
    import gymnasium as gym

    env = gym.make("VT-SQL-v0", **env_kwargs)
    try:
        ids = env.unwrapped.tasks.ids()[:n]
        rewards = [run_episode(env, policy, options={"task_id": i}).reward for i in ids]
    finally:
        env.close()
    return sum(rewards) / len(rewards)


def main(argv: Sequence[str] | None = None) -> None:
    """Print distinct-question counts and shortcut scores on the embedded databases."""
    parser = argparse.ArgumentParser(prog="python -m vt_envs.domains.sql.shortcuts")
    parser.add_argument("--train", type=int, default=10_000, help="train questions per database")
    parser.add_argument("--test", type=int, default=100, help="test questions per database")
    parser.add_argument("--fit", type=int, default=1000, help="train tasks per db to fit on")
    parser.add_argument("--databases", nargs="+", default=["flights", "tpch", "shop"])
    parser.add_argument("--skip-counts", action="store_true")
    args = parser.parse_args(argv)
    from vt_envs.domains.sql.tasks import sql_tasks

    if not args.skip_counts:
        for db in args.databases:
            for split, size in (("train", args.train), ("test", args.test)):
                print(f"distinct {db} {split}: {distinct_questions(split, size, db)} of {size}")
    train = sql_tasks("train", databases=args.databases, size_per_database=args.fit)
    table = fit_most_common(train[i] for i in range(len(train)))
    kwargs = {"split": "test", "databases": args.databases, "size_per_database": args.test}
    n = args.test * len(args.databases)
    for label, policy in (
        ("empty query", ConstantQueryPolicy()),
        ("SELECT 0", ConstantQueryPolicy("SELECT 0")),
        ("SELECT 1", ConstantQueryPolicy("SELECT 1")),
        ("most common answer", MostCommonAnswerPolicy(table)),
    ):
        print(f"shortcut {label}: {_score(kwargs, policy, n):.3f} on {n} test tasks")


if __name__ == "__main__":
    main()
