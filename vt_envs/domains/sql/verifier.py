"""Execution match: the final SQL scores 1.0 when it returns what the gold SQL returns.

Both queries run on the task's database through the same read-only,
time-limited path as the agent's tool (:func:`~vt_envs.domains.sql.execution.execute_query`).
Results are compared as multisets of rows — as ordered lists only when the
gold query has a top-level ``ORDER BY`` (Spider's rule) — with a float
tolerance; optionally the columns may come in any order. A final query that
fails, times out, or is not a single read-only statement scores 0.

The gold SQL is never shown to the agent and never put in ``info``: the
score's ``parts`` are numbers, and its ``detail`` (for transcripts) names
only error kinds and row counts.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from vt_envs.core.task import Task
from vt_envs.core.verifier import Score
from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.execution import QueryOutcome, execute_query

__all__ = [
    "ExecutionMatch",
    "extract_sql",
    "has_top_level_order_by",
    "results_match",
]

_FENCE = re.compile(r"```(?:sql|SQL)?\s*(.*?)```", re.DOTALL)
# Column permutations tried by the column-order-insensitive comparison.
_MAX_PERMUTATIONS = 720


def extract_sql(answer: str) -> str:
    """The SQL in an answer: the body of a Markdown code fence if there is one."""
    match = _FENCE.search(answer)
    return (match.group(1) if match else answer).strip()


def _strip_literals(sql: str) -> str:
    """``sql`` with string literals, quoted identifiers and comments blanked out."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"/\*.*?\*/", " ", sql, flags=re.DOTALL)
    sql = re.sub(r"'(?:[^']|'')*'", "''", sql)
    return re.sub(r'"(?:[^"]|"")*"', '""', sql)


def has_top_level_order_by(sql: str) -> bool:
    """Whether ``sql`` orders its final output (an ``ORDER BY`` outside parentheses)."""
    text = _strip_literals(sql)
    depth = 0
    for match in re.finditer(r"[()]|\border\s+by\b", text, flags=re.IGNORECASE):
        token = match.group(0)
        if token == "(":
            depth += 1
        elif token == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            return True
    return False


def _normalize(value: Any) -> Any:
    """A value in a form that compares across equivalent SQL types."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, (list, tuple)):
        return tuple(_normalize(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _normalize(v)) for k, v in value.items()))
    return value


def _sort_key(row: tuple) -> tuple:
    # Numbers sort by a rounded value so tolerance-equal rows line up; types
    # are ranked so mixed columns still sort.
    key = []
    for value in row:
        if value is None:
            key.append((0, 0.0, ""))
        elif isinstance(value, (int, float)):
            key.append((1, float(f"{float(value):.6g}"), ""))
        else:
            key.append((2, 0.0, repr(value)))
    return tuple(key)


def _values_equal(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    return a == b


def _rows_equal(a: Sequence[tuple], b: Sequence[tuple], rel_tol: float, abs_tol: float) -> bool:
    return all(
        len(x) == len(y) and all(_values_equal(u, v, rel_tol, abs_tol) for u, v in zip(x, y))
        for x, y in zip(a, b)
    )


def _same_rows(
    gold: list[tuple], pred: list[tuple], order_matters: bool, rel_tol: float, abs_tol: float
) -> bool:
    if not order_matters:
        gold, pred = sorted(gold, key=_sort_key), sorted(pred, key=_sort_key)
    return _rows_equal(gold, pred, rel_tol, abs_tol)


def results_match(
    gold: Sequence[Sequence[Any]],
    pred: Sequence[Sequence[Any]],
    *,
    order_matters: bool = False,
    column_order_insensitive: bool = False,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-9,
) -> bool:
    """Whether two query results are equal.

    Rows are compared as multisets (as lists when ``order_matters``); numbers
    of any SQL type compare with ``math.isclose``; dates compare as ISO
    strings. With ``column_order_insensitive``, the prediction matches if
    some permutation of its columns does (columns are paired only with
    columns holding the same values, so few permutations are tried).
    """
    gold_rows = [tuple(_normalize(v) for v in row) for row in gold]
    pred_rows = [tuple(_normalize(v) for v in row) for row in pred]
    if len(gold_rows) != len(pred_rows):
        return False
    if not gold_rows:
        return True
    width = len(gold_rows[0])
    if any(len(row) != width for row in pred_rows):
        return False
    if _same_rows(gold_rows, pred_rows, order_matters, rel_tol, abs_tol):
        return True
    if not column_order_insensitive or width < 2:
        return False
    for perm in _candidate_permutations(gold_rows, pred_rows, rel_tol, abs_tol):
        permuted = [tuple(row[i] for i in perm) for row in pred_rows]
        if _same_rows(gold_rows, permuted, order_matters, rel_tol, abs_tol):
            return True
    return False


def _candidate_permutations(
    gold: list[tuple], pred: list[tuple], rel_tol: float, abs_tol: float
) -> list[tuple[int, ...]]:
    """Column permutations of ``pred`` whose columns each hold the gold column's values."""
    width = len(gold[0])

    def column(rows: list[tuple], i: int) -> list[tuple]:
        return sorted(((row[i],) for row in rows), key=_sort_key)

    gold_cols = [column(gold, i) for i in range(width)]
    pred_cols = [column(pred, j) for j in range(width)]
    options = [
        [j for j in range(width) if _rows_equal(gold_cols[i], pred_cols[j], rel_tol, abs_tol)]
        for i in range(width)
    ]
    perms = []
    for perm in itertools.product(*options):
        if len(set(perm)) == width:
            perms.append(perm)
            if len(perms) >= _MAX_PERMUTATIONS:
                break
    return perms


class ExecutionMatch:
    """The VT-SQL verifier: execute the answer and the gold, compare the results.

    ``task.gold`` is the gold SQL; ``task.assets["db_path"]`` the DuckDB file.
    Gold results are cached per (database, gold SQL), since a task is scored
    many times in training.

    Args:
        timeout_s: time limit of each query.
        column_order_insensitive: accept the right columns in another order.
        rel_tol, abs_tol: float tolerance (``math.isclose``).
        max_result_rows: results larger than this score 0 (and gold results
            larger than this are a task bug).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        column_order_insensitive: bool = False,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
        max_result_rows: int = 100_000,
        gold_cache_size: int = 4096,
    ):
        self.timeout_s = timeout_s
        self.column_order_insensitive = column_order_insensitive
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.max_result_rows = max_result_rows
        self._gold_cache: OrderedDict[tuple[str, str], QueryOutcome] = OrderedDict()
        self._gold_cache_size = gold_cache_size
        self._lock = threading.Lock()

    def run(self, db_path: str, sql: str) -> QueryOutcome:
        """Execute ``sql`` on ``db_path`` read-only with this verifier's limits."""
        con = connect_readonly(db_path)
        try:
            return execute_query(
                con, sql, timeout_s=self.timeout_s, count_limit=self.max_result_rows
            )
        finally:
            con.close()

    def gold_result(self, task: Task) -> QueryOutcome:
        key = (str(task.assets["db_path"]), str(task.gold))
        with self._lock:
            cached = self._gold_cache.get(key)
            if cached is not None:
                self._gold_cache.move_to_end(key)
                return cached
        outcome = self.run(*key)
        if outcome.ok:
            with self._lock:
                self._gold_cache[key] = outcome
                while len(self._gold_cache) > self._gold_cache_size:
                    self._gold_cache.popitem(last=False)
        return outcome

    def __call__(self, task: Task, answer: str) -> Score:
        sql = extract_sql(answer)
        gold = self.gold_result(task)
        if not gold.ok:
            # A broken gold is a dataset bug, not the agent's fault; it still scores 0.
            return Score(0.0, {"correct": 0.0, "executed": 0.0}, f"gold failed: {gold.error}")
        pred = self.run(str(task.assets["db_path"]), sql)
        if not pred.ok:
            return Score(0.0, {"correct": 0.0, "executed": 0.0}, f"answer failed: {pred.error}")
        match = results_match(
            gold.rows,
            pred.rows,
            order_matters=has_top_level_order_by(str(task.gold)),
            column_order_insensitive=self.column_order_insensitive,
            rel_tol=self.rel_tol,
            abs_tol=self.abs_tol,
        )
        value = float(match)
        detail = (
            "results match"
            if match
            else (
                f"results differ ({len(pred.rows)} rows x {len(pred.columns)} columns vs "
                f"{len(gold.rows)} x {len(gold.columns)} expected)"
            )
        )
        return Score(value, {"correct": value, "executed": 1.0}, detail)
