"""Running one untrusted SQL statement on a read-only DuckDB connection, with a timeout.

Shared by the agent's tool and the verifier, so both apply the same rules:

- exactly one statement (``a; b`` is rejected before anything runs);
- only read-only statement kinds (``SELECT`` — which covers ``WITH``,
  ``DESCRIBE``, ``SHOW``, ``SUMMARIZE`` —, ``EXPLAIN`` and ``PRAGMA``); the
  connection itself is read-only with external access off and its
  configuration locked (:func:`~vt_envs.domains.sql.databases.connect_readonly`),
  so this check is a second layer, not the only one;
- a wall-clock timeout enforced with ``connection.interrupt()`` from a timer
  thread, which stops even an exploding cross join inside DuckDB.

Failures are returned as :class:`QueryOutcome` with an error kind, never
raised: they are the policy's mistakes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import duckdb

__all__ = ["ALLOWED_STATEMENTS", "QueryOutcome", "execute_query"]

ALLOWED_STATEMENTS = frozenset(
    {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.PRAGMA}
)
_MAX_ERROR_CHARS = 800
_COUNT_CHUNK = 8192


@dataclass(frozen=True)
class QueryOutcome:
    """What one statement produced.

    Attributes:
        columns: result column names (empty on error).
        rows: the fetched rows (at most ``max_rows`` of them).
        total_rows: how many rows the result has; ``None`` when counting
            stopped at ``count_limit`` (the result has more).
        error: ``None``, or the error kind: ``"empty"``, ``"syntax_error"``,
            ``"multiple_statements"``, ``"not_read_only"``, ``"timeout"``,
            ``"permission_denied"``, ``"catalog_error"``, ``"execution_error"``,
            ``"too_many_rows"``.
        message: the error text shown to the agent (``""`` when ok).
        exec_s: seconds spent.
    """

    columns: tuple[str, ...] = ()
    rows: tuple[tuple, ...] = ()
    total_rows: int | None = 0
    error: str | None = None
    message: str = ""
    exec_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, duckdb.InterruptException):
        return "timeout"
    if isinstance(exc, duckdb.PermissionException):
        return "permission_denied"
    if isinstance(exc, duckdb.ParserException):
        return "syntax_error"
    if isinstance(exc, (duckdb.CatalogException, duckdb.BinderException)):
        return "catalog_error"
    return "execution_error"


def _failure(error: str, message: str, start: float) -> QueryOutcome:
    message = message.strip()
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + " ..."
    return QueryOutcome(error=error, message=message, exec_s=time.monotonic() - start)


def check_statement(con: duckdb.DuckDBPyConnection, sql: str) -> QueryOutcome | str:
    """Return the single read-only statement in ``sql``, or a failed outcome saying why."""
    start = time.monotonic()
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        return _failure("syntax_error", str(exc), start)
    if not statements:
        return _failure("empty", "The query is empty.", start)
    if len(statements) > 1:
        return _failure(
            "multiple_statements",
            f"Run one statement per call; got {len(statements)} statements.",
            start,
        )
    statement = statements[0]
    if statement.type not in ALLOWED_STATEMENTS:
        kind = statement.type.name
        return _failure(
            "not_read_only",
            f"Only read-only queries (SELECT, WITH, DESCRIBE, SHOW, EXPLAIN) are allowed; "
            f"got a {kind} statement. The database is read-only.",
            start,
        )
    return sql


def execute_query(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    timeout_s: float,
    max_rows: int | None = None,
    count_limit: int = 100_000,
) -> QueryOutcome:
    """Run ``sql`` (one read-only statement) on ``con`` and fetch its result.

    Blocks for at most about ``timeout_s`` seconds: a timer thread calls
    ``con.interrupt()``. Fetches ``max_rows`` rows (all when ``None``) and
    counts the rest up to ``count_limit``; with ``max_rows=None`` a result
    larger than ``count_limit`` fails with ``"too_many_rows"``. ``con``
    must not be used by another thread at the same time.
    """
    checked = check_statement(con, sql)
    if isinstance(checked, QueryOutcome):
        return checked
    start = time.monotonic()
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        cursor = con.execute(checked)
        columns = tuple(d[0] for d in cursor.description or ())
        limit = count_limit if max_rows is None else max_rows
        rows = cursor.fetchmany(limit + 1) if cursor.description else []
        total: int | None = len(rows)
        if len(rows) > limit:
            if max_rows is None:
                return _failure(
                    "too_many_rows", f"The result has more than {count_limit} rows.", start
                )
            rows = rows[:limit]
            total = _count_rest(cursor, len(rows) + 1, count_limit)
    except duckdb.Error as exc:
        return _failure(_error_kind(exc), str(exc), start)
    finally:
        timer.cancel()
    return QueryOutcome(columns, tuple(rows), total, exec_s=time.monotonic() - start)


def _count_rest(cursor: duckdb.DuckDBPyConnection, seen: int, count_limit: int) -> int | None:
    """Count the remaining rows (``None`` past ``count_limit``) without keeping them."""
    while seen <= count_limit:
        chunk = cursor.fetchmany(_COUNT_CHUNK)
        if not chunk:
            return seen
        seen += len(chunk)
    return None
