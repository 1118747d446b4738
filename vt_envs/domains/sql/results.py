"""What the SQL worker computes from results, in pure Python (no DuckDB, no vt_envs).

Shared by the host (trusted callers: question generation, tests) and by the
sandboxed SQL worker (:mod:`vt_envs.domains.sql.worker`), which imports it
without the package's ``__init__``:

- :func:`format_value` / :func:`render_table`: a result as a compact text table;
- :func:`results_match`: execution match of two results (multisets, or lists
  when the gold orders its output; float tolerance; optional column order),
  exact multisets first (hashing, linear in the result), the tolerant
  comparison only when they differ; :class:`ResultRows` keeps a result's
  normalized rows for the next comparison (cached golds);
- :func:`extract_sql`, :func:`has_top_level_order_by`: reading the answer text.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import functools
import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "EPISODE_RESULTS",
    "ResultRows",
    "extract_sql",
    "format_value",
    "has_top_level_order_by",
    "render_table",
    "results_match",
]


def format_value(value: Any, max_chars: int = 60) -> str:
    """One cell as compact text: ``NULL``, trimmed floats, ISO dates, cut long strings."""
    if value is None:
        text = "NULL"
    elif isinstance(value, float):
        text = f"{value:.10g}"
    elif isinstance(value, decimal.Decimal):
        text = str(value)
    elif isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        is_datetime = isinstance(value, datetime.datetime)
        text = value.isoformat(sep=" ") if is_datetime else value.isoformat()
    elif isinstance(value, bytes):
        text = f"<{len(value)} bytes>"
    else:
        text = str(value)
    text = text.replace("\n", "\\n").replace("|", "\\|")
    if len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    return text


def render_table(
    columns: Sequence[str],
    rows: Sequence[tuple],
    total_rows: int | None,
    *,
    max_chars: int = 9000,
    max_cell_chars: int = 60,
    count_limit: int = 10_000,
) -> str:
    """Render a result as ``a | b`` lines with a header, cut at ``max_chars``.

    Ends with a note when rows were left out: ``(showing 50 of 1234 rows)``.
    ``total_rows=None`` means "more than ``count_limit``".
    """
    if not columns:
        return "OK (the statement returned no result set)."
    lines = [" | ".join(columns)]
    shown = 0
    size = len(lines[0])
    for row in rows:
        line = " | ".join(format_value(v, max_cell_chars) for v in row)
        if size + 1 + len(line) > max_chars:
            break
        lines.append(line)
        size += 1 + len(line)
        shown += 1
    if not rows:
        lines.append("(no rows)")
    elif total_rows is None:
        lines.append(f"(showing {shown} of more than {count_limit} rows)")
    elif shown < total_rows:
        lines.append(f"(showing {shown} of {total_rows} rows)")
    else:
        lines.append(f"({total_rows} row{'s' if total_rows != 1 else ''})")
    return "\n".join(lines)


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


@functools.lru_cache(maxsize=4096)  # asked of the same gold at every verification
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


_UNCHANGED = frozenset({int, str, type(None)})  # types _normalize returns as they are
#: Complete results an episode's worker keeps for its verification (the latest
#: queries); the host mirrors which of them it may grade without asking.
EPISODE_RESULTS = 4
# Normalized values whose repr() is injective and self-delimiting (Python literals).
_DIGEST_TYPES = frozenset({int, float, str, bytes, type(None)})


def _literal(value: Any) -> bool:
    """Whether ``value`` is a tuple tree of :data:`_DIGEST_TYPES`, with no NaN."""
    kind = type(value)
    if kind is tuple:
        return all(_literal(v) for v in value)
    return kind in _DIGEST_TYPES and (kind is not float or value == value)


def _normalize_row(row: Sequence[Any]) -> tuple:
    for value in row:
        if type(value) not in _UNCHANGED and not (type(value) is float and value == value):
            return tuple(_normalize(v) for v in row)
    return tuple(row)


class ResultRows:
    """A result's rows, with their normalized forms and their multiset computed
    once and kept (a cached gold result is compared with many answers).

    Args:
        rows: the rows as fetched.
        width: the number of columns (default: the first row's length).
    """

    __slots__ = ("_counts", "_digests", "_normalized", "rows", "width")

    def __init__(self, rows: Sequence[Sequence[Any]], width: int | None = None):
        self.rows = rows
        self.width = width if width is not None else (len(rows[0]) if rows else 0)
        self._normalized: list[tuple] | None = None
        self._counts: collections.Counter | bool | None = False  # False: not computed yet
        self._digests: tuple[str, str] | bool | None = False  # False: not computed yet

    @property
    def normalized(self) -> list[tuple]:
        if self._normalized is None:
            self._normalized = [_normalize_row(row) for row in self.rows]
        return self._normalized

    def counts(self) -> collections.Counter | None:
        """The normalized rows as a multiset (``None`` if some value is unhashable)."""
        if self._counts is False:
            try:
                self._counts = collections.Counter(self.normalized)
            except TypeError:
                self._counts = None
        return self._counts  # type: ignore[return-value]

    def digests(self) -> tuple[str, str] | None:
        """SHA-256 digests of the normalized rows as a list and as a multiset
        (``None`` when some value is not a plain literal: then there is none).

        Exact by construction: each row is written as its ``repr``, which for
        tuples of ints, floats (no NaN), strings, bytes and ``None`` is
        injective and holds no newline; the rows joined by newlines, in order
        or sorted, are hashed. Equal ordered digests therefore mean equal
        normalized lists, equal multiset digests equal multisets, and either
        makes :func:`results_match` true whatever its tolerances and column
        flag (its exact comparison comes first). Unequal digests mean nothing.
        """
        if self._digests is False:
            self._digests = None
            rows = self.normalized
            if all(_literal(row) for row in rows):
                try:
                    texts = [repr(row) for row in rows]
                except ValueError:  # an int past Python's digit limit for str()
                    return None
                self._digests = (_sha256("ordered\n", texts), _sha256("multiset\n", sorted(texts)))
        return self._digests  # type: ignore[return-value]

    def digest(self, order_matters: bool) -> str | None:
        """The digest :func:`results_match` with ``order_matters`` compares exactly."""
        digests = self.digests()
        return None if digests is None else digests[0 if order_matters else 1]


def _sha256(kind: str, texts: list[str]) -> str:
    data = (kind + "\n".join(texts)).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


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
    gold: Sequence[Sequence[Any]] | ResultRows,
    pred: Sequence[Sequence[Any]] | ResultRows,
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

    Exactly equal results (after normalization) are recognized in linear
    time, by hashing; the sort-and-tolerance comparison runs only otherwise.
    """
    gold = gold if isinstance(gold, ResultRows) else ResultRows(gold)
    pred = pred if isinstance(pred, ResultRows) else ResultRows(pred)
    gold_rows, pred_rows = gold.normalized, pred.normalized
    if len(gold_rows) != len(pred_rows):
        return False
    if not gold_rows:
        return True
    width = len(gold_rows[0])
    if any(len(row) != width for row in pred_rows):
        return False
    if order_matters:
        if gold_rows == pred_rows:
            return True
    else:
        gold_counts, pred_counts = gold.counts(), pred.counts()
        if gold_counts is not None and gold_counts == pred_counts:
            return True
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
