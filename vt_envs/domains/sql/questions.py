"""Templated questions with gold SQL over the embedded databases, each checked by execution.

A :class:`Template` pairs a question with its gold SQL; its parameters are
drawn with a seeded RNG from *pools* of values read from the database
(airport codes, market segments, ...). A drawn question is kept only if its
gold SQL passes :func:`check_gold`: it runs, returns the same non-empty
result twice, and the result is not already written in the question.

Difficulty grows with the SQL needed: ``easy`` (one table, filters,
aggregates), ``medium`` (joins, GROUP BY / HAVING, ORDER BY ... LIMIT),
``hard`` (nested queries, EXISTS, self-joins, window functions).

Splits are disjoint by construction, and the test split holds out whole
kinds of question, not only constants: a template marked ``held_out`` is
never drawn for train (its questions appear only in test), and a question of
any other template belongs to the test split exactly when a hash of its gold
SQL falls in the held-out bucket (one in five), so no train draw can produce
a test question. Each draw picks its template uniformly among those its
split may use, so every template (held-out ones included) has the same share
of the test split. The test split of each database is deduplicated; task
``k`` of a split is the same on every machine as long as this module, the
templates and the database are unchanged (ids ``sql/<db>/<split>/<k>``).

The templates and the pools they draw from live in
:mod:`vt_envs.domains.sql.templates`, one module per database; this module
draws and checks their questions.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from random import Random
from typing import Any

import duckdb

from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.execution import execute_query
from vt_envs.domains.sql.results import format_value, has_top_level_order_by, results_match
from vt_envs.domains.sql.templates import POOLS, TEMPLATES
from vt_envs.domains.sql.templates.base import DIFFICULTIES, Template, pick, sql_str

__all__ = [
    "DIFFICULTIES",
    "POOLS",
    "TEMPLATES",
    "GeneratedQuestion",
    "QuestionBank",
    "Template",
    "check_gold",
    "sql_str",
]

_TEST_BUCKETS = 5  # one bucket in five is held out
_MAX_ATTEMPTS = 2000
_PARAM_TRIES = 25  # parameter draws per template draw until the split's hash bucket is hit


def _mentioned(value: Any, question: str) -> bool:
    text = format_value(value, max_chars=1000)
    return re.search(r"(?<![\w.])" + re.escape(text) + r"(?![\w.])", question) is not None


def check_gold(
    con: duckdb.DuckDBPyConnection, sql: str, question: str, *, timeout_s: float = 10.0
) -> str | None:
    """Why ``sql`` is not a usable gold query for ``question``, or ``None`` if it is.

    Usable: it runs (twice, with equal results), returns at least one row
    with a non-NULL value, and its result is not written out in the question
    (every value of a one-row or one-column result appearing there).
    """
    first = execute_query(con, sql, timeout_s=timeout_s)
    if not first.ok:
        return f"gold failed: {first.error}: {first.message}"
    if not first.rows or all(v is None for row in first.rows for v in row):
        return "empty result"
    second = execute_query(con, sql, timeout_s=timeout_s)
    order = has_top_level_order_by(sql)
    if not second.ok or not results_match(first.rows, second.rows, order_matters=order):
        return "nondeterministic result"
    values = [v for row in first.rows for v in row]
    if (len(first.rows) == 1 or len(first.columns) == 1) and all(
        _mentioned(v, question) for v in values
    ):
        return "answer appears in the question"
    return None


@dataclass(frozen=True)
class GeneratedQuestion:
    """A checked question: its text, gold SQL, template and parameters."""

    question: str
    sql: str
    template: Template
    params: Mapping[str, Any] = field(default_factory=dict)


def split_of(sql: str, held_out: bool = False) -> str:
    """``"test"`` for a held-out template's question or the held-out hash bucket,
    else ``"train"``."""
    if held_out:
        return "test"
    bucket = int(hashlib.sha256(sql.encode()).hexdigest(), 16) % _TEST_BUCKETS
    return "test" if bucket == 0 else "train"


class QuestionBank:
    """Checked questions of one embedded database, drawn deterministically.

    ``question(split, k)`` is a pure function of (database, split, k); for the
    test split it is the k-th *distinct* question, so the held-out set has no
    repeats. Safe to call from several threads (a tool server resolves task ids
    on two): one lock serializes the draws, which share the test split's
    running state and one DuckDB connection.
    """

    def __init__(self, db_name: str, db_path: str):
        self.db_name, self.db_path = db_name, str(db_path)
        self.templates = TEMPLATES[db_name]
        self._lock = threading.Lock()
        self._test: list[GeneratedQuestion] = []
        self._test_seen: set[str] = set()
        self._test_draws = 0

    @functools.cached_property
    def _con(self) -> duckdb.DuckDBPyConnection:
        return connect_readonly(self.db_path)

    @functools.cached_property
    def pools(self) -> dict[str, list[tuple]]:
        queries = POOLS[self.db_name]
        return {name: self._con.execute(sql).fetchall() for name, sql in queries.items()}

    def _draw(self, split: str, stream: int) -> GeneratedQuestion | None:
        rng = Random(f"vt-sql/{self.db_name}/{split}/{stream}")
        allowed = [t for t in self.templates if split == "test" or not t.held_out]
        template = pick(rng, allowed)
        for _ in range(_PARAM_TRIES):
            params = template.sample(self.pools, rng)
            question, sql = template.render(params)
            if split_of(sql, template.held_out) == split:
                break
        else:
            return None
        if check_gold(self._con, sql, question) is not None:
            return None
        return GeneratedQuestion(question, sql, template, params)

    def question(self, split: str, k: int) -> GeneratedQuestion:
        """The ``k``-th question of ``split``."""
        with self._lock:
            return self._question(split, k)

    def _question(self, split: str, k: int) -> GeneratedQuestion:
        if split == "test":
            while len(self._test) <= k:
                self._test.append(self._next_distinct_test())
            return self._test[k]
        for attempt in range(_MAX_ATTEMPTS):
            found = self._draw(split, k * _MAX_ATTEMPTS + attempt)
            if found is not None:
                return found
        raise RuntimeError(f"no usable {self.db_name} question for {split}/{k}")  # a template bug

    def _next_distinct_test(self) -> GeneratedQuestion:
        for _ in range(_MAX_ATTEMPTS):
            self._test_draws += 1
            found = self._draw("test", self._test_draws)
            if found is not None and found.sql not in self._test_seen:
                self._test_seen.add(found.sql)
                return found
        raise RuntimeError(
            f"the {self.db_name} templates ran out of distinct test questions after "
            f"{len(self._test)}; use a smaller test size"
        )

    def close(self) -> None:
        with self._lock:
            if "_con" in self.__dict__:
                self.__dict__.pop("_con").close()
