"""Running one untrusted SQL statement on a read-only DuckDB connection, with a timeout.

Used inside the sandboxed SQL worker (:mod:`vt_envs.domains.sql.worker`) for
the agent's tool and the verifier alike, so both apply the same rules:

- exactly one statement (``a; b`` is rejected before anything runs);
- an allow-list of statement kinds, read from DuckDB's own parser: ``SELECT``
  (which covers ``WITH``, ``FROM``-first, ``VALUES``, ``DESCRIBE``, ``SHOW``,
  ``SUMMARIZE``), ``EXPLAIN [ANALYZE]`` of an allowed statement (checked
  again after the prefix, since ``EXPLAIN ANALYZE`` runs what it explains),
  and the informational ``PRAGMA``\\s in :data:`ALLOWED_PRAGMAS` (``IMPORT
  DATABASE`` parses as a PRAGMA and is refused). Everything else is refused.
  The connection itself is read-only with external access off and its
  configuration locked (:func:`connect_readonly`), so this check is a second
  layer, not the only one;
- a wall-clock timeout enforced with ``connection.interrupt()`` from one
  watchdog thread per process (started once, armed per query: a timer
  thread per query would cost as much as a small query). Some plans cannot
  be interrupted (the optimizer of an exponential plan, a huge fetch); the
  host's hard kill of the worker covers those.

The statement is parsed once: the checked statement object is what runs, and
it is kept for the SQL text (the 1,024 latest allowed texts of at most 4,096
characters), so a SQL run again (a gold, a repeated query) is neither parsed
nor checked again.

Failures are returned as :class:`QueryOutcome` with an error kind, never
raised: they are the policy's mistakes. This module imports only DuckDB and
the standard library (the sandboxed worker loads it without ``vt_envs``).
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import duckdb

__all__ = [
    "ALLOWED_PRAGMAS",
    "ALLOWED_STATEMENTS",
    "READONLY_CONFIG",
    "QueryOutcome",
    "check_statement",
    "connect_readonly",
    "execute_query",
]

#: Settings of every connection an agent or a verifier uses.
READONLY_CONFIG: Mapping[str, object] = {
    "enable_external_access": False,  # no COPY TO, ATTACH, read_csv, glob, INSTALL
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "python_enable_replacements": False,  # no scanning of Python variables by name
    "memory_limit": "2GB",
    "lock_configuration": True,  # must come last: SET/PRAGMA can no longer change the above
}

ALLOWED_STATEMENTS = frozenset(
    {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.PRAGMA}
)
#: PRAGMAs that only report (table layouts, sizes, versions).
ALLOWED_PRAGMAS = frozenset(
    {
        "table_info",
        "show",
        "show_tables",
        "show_tables_expanded",
        "show_databases",
        "database_list",
        "database_size",
        "storage_info",
        "version",
        "platform",
        "collations",
    }
)
_MAX_ERROR_CHARS = 800
_COUNT_CHUNK = 8192
# The watchdog thread's longest sleep: queries whose deadline is further off arm it for free.
_WATCHDOG_TICK_S = 0.5
_ALLOWED_KINDS = "SELECT (with WITH, DESCRIBE, SHOW, SUMMARIZE), EXPLAIN and informational PRAGMAs"
# Leading whitespace and comments, then EXPLAIN [ANALYZE] [(options)], case-insensitive.
_SKIP = r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
_EXPLAIN = re.compile(
    rf"^{_SKIP}explain\b{_SKIP}(?:analyze\b{_SKIP})?(?:\((?:[^()']|'[^']*')*\){_SKIP})?",
    re.IGNORECASE | re.DOTALL,
)
# SQL texts that parsed as one allowed statement -> that statement (oldest first): a
# SQL run again (a gold, a repeated query) skips the parse and the check, and DuckDB
# runs a statement object it ran before faster than a freshly parsed one.
_ALLOWED: dict[str, duckdb.Statement] = {}
_ALLOWED_CACHE_SIZE = 1024
_ALLOWED_MAX_CHARS = 4096  # longer texts are parsed each time: the cache stays small
_ALLOWED_LOCK = threading.Lock()
_PRAGMA = re.compile(rf"^{_SKIP}pragma\s+([a-z_][a-z0-9_]*)", re.IGNORECASE | re.DOTALL)


def connect_readonly(
    path: str | os.PathLike[str], *, memory_limit: str | None = None, threads: int | None = None
) -> duckdb.DuckDBPyConnection:
    """Open ``path`` read-only with :data:`READONLY_CONFIG` (optionally another
    memory limit and thread count, set before the configuration is locked)."""
    config = dict(READONLY_CONFIG)
    if memory_limit is not None:
        config["memory_limit"] = memory_limit
    if threads is not None:
        config["threads"] = threads
    config["lock_configuration"] = config.pop("lock_configuration")  # keep it last
    return duckdb.connect(str(path), read_only=True, config=config)


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
            ``"out_of_memory"``, ``"too_many_rows"``.
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
    if isinstance(exc, duckdb.OutOfMemoryException):
        return "out_of_memory"
    return "execution_error"


def _failure(error: str, message: str, start: float) -> QueryOutcome:
    message = message.strip()
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + " ..."
    return QueryOutcome(error=error, message=message, exec_s=time.monotonic() - start)


def _refusal(kind: str, start: float) -> QueryOutcome:
    return _failure(
        "not_read_only",
        f"Only read-only queries ({_ALLOWED_KINDS}) are allowed; got {kind}. "
        "The database is read-only.",
        start,
    )


def check_statement(con: duckdb.DuckDBPyConnection, sql: str) -> QueryOutcome | str:
    """Return the single allowed statement in ``sql``, or a failed outcome saying why."""
    checked = _checked_statement(con, sql)
    return checked if isinstance(checked, QueryOutcome) else sql


def _checked_statement(con: duckdb.DuckDBPyConnection, sql: str) -> QueryOutcome | duckdb.Statement:
    """The parsed single allowed statement in ``sql``, or a failed outcome saying why."""
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
    refusal = _classify(con, statements[0], start, depth=0)
    return refusal if refusal is not None else statements[0]


def _classify(
    con: duckdb.DuckDBPyConnection, statement: duckdb.Statement, start: float, depth: int
) -> QueryOutcome | None:
    """``None`` if ``statement`` is allowed, else why not (EXPLAIN: its target decides)."""
    kind = statement.type
    text = statement.query
    if kind == duckdb.StatementType.SELECT:
        return None
    if kind == duckdb.StatementType.PRAGMA:
        match = _PRAGMA.match(text)
        if match is None:  # IMPORT DATABASE and other statements DuckDB files as PRAGMA
            return _refusal("a statement DuckDB treats as a PRAGMA", start)
        if match.group(1).lower() not in ALLOWED_PRAGMAS:
            return _refusal(f"PRAGMA {match.group(1)} (not an informational pragma)", start)
        return None
    if kind == duckdb.StatementType.EXPLAIN and depth == 0:
        prefix = _EXPLAIN.match(text)
        if prefix is None:
            return _refusal("an EXPLAIN whose target could not be read", start)
        try:
            inner = con.extract_statements(text[prefix.end() :])
        except duckdb.Error as exc:
            return _failure("syntax_error", str(exc), start)
        if len(inner) != 1:
            return _refusal("an EXPLAIN of several statements", start)
        refusal = _classify(con, inner[0], start, depth + 1)
        return None if refusal is None else _refusal(f"EXPLAIN of {inner[0].type.name}", start)
    return _refusal(f"a {kind.name} statement", start)


def execute_query(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    timeout_s: float,
    max_rows: int | None = None,
    count_limit: int = 100_000,
    keep_counted: bool = False,
) -> QueryOutcome:
    """Run ``sql`` (one allowed statement) on ``con`` and fetch its result.

    Blocks for about ``timeout_s`` seconds at most where DuckDB can be
    interrupted (the watchdog calls ``con.interrupt()``). Fetches
    ``max_rows`` rows (all when ``None``) and counts the rest up to
    ``count_limit``; with ``max_rows=None`` a result larger than
    ``count_limit`` fails with ``"too_many_rows"``. With ``keep_counted`` the
    counted rows are kept too: ``rows`` holds the first ``count_limit`` rows
    (all of them when ``total_rows`` is not ``None``) and the caller shows
    the first ``max_rows``. ``con`` must not be used by another thread at the
    same time.
    """
    checked = _allowed_statement(con, sql)
    if isinstance(checked, QueryOutcome):
        return checked
    start = time.monotonic()
    alarm = _WATCHDOG.arm(con, timeout_s)
    try:
        cursor = con.execute(checked)
        columns = tuple(d[0] for d in cursor.description or ())
        limit = count_limit if max_rows is None or keep_counted else max_rows
        rows = cursor.fetchmany(limit + 1) if cursor.description else []
        total: int | None = len(rows)
        if len(rows) > limit:
            if max_rows is None:
                return _failure(
                    "too_many_rows", f"The result has more than {count_limit} rows.", start
                )
            rows = rows[:limit]
            total = None if keep_counted else _count_rest(cursor, len(rows) + 1, count_limit)
    except duckdb.Error as exc:
        return _failure(_error_kind(exc), str(exc), start)
    finally:
        _WATCHDOG.disarm(alarm)
    return QueryOutcome(columns, tuple(rows), total, exec_s=time.monotonic() - start)


def _allowed_statement(con: duckdb.DuckDBPyConnection, sql: str) -> QueryOutcome | duckdb.Statement:
    """:func:`_checked_statement`, remembered for the SQL texts that passed: the
    statement is the parse, not a plan (it binds to whichever database runs it)."""
    checked = _ALLOWED.get(sql)
    if checked is None:
        checked = _checked_statement(con, sql)
        if not isinstance(checked, QueryOutcome) and len(sql) <= _ALLOWED_MAX_CHARS:
            with _ALLOWED_LOCK:
                _ALLOWED[sql] = checked
                while len(_ALLOWED) > _ALLOWED_CACHE_SIZE:
                    del _ALLOWED[next(iter(_ALLOWED))]
    return checked


class _Watchdog:
    """One daemon thread that interrupts each armed connection past its deadline.

    The thread wakes at the earliest deadline or every :data:`_WATCHDOG_TICK_S`,
    so arming a query whose deadline lies beyond the next wake-up costs a
    lock and no thread switch. Once :meth:`disarm` returns, that alarm can no
    longer fire (the thread interrupts only while holding the lock, and only
    alarms still armed). Safe to use from several threads at once, each with
    its own connection; a forked child starts its own thread on first use.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._alarms: dict[int, tuple[float, duckdb.DuckDBPyConnection]] = {}
        self._next = 0
        self._wake_at = 0.0
        self._thread: threading.Thread | None = None

    def arm(self, con: duckdb.DuckDBPyConnection, timeout_s: float) -> int:
        """Interrupt ``con`` ``timeout_s`` seconds from now (unless disarmed first).

        ``ValueError`` unless ``timeout_s`` is finite and > 0: the alarms are
        shared by every connection of the process, and a NaN deadline (it
        compares false with everything) would turn the thread's wake-up time
        into NaN, a busy loop that never fires that alarm.
        """
        if isinstance(timeout_s, bool) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        with self._changed:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="vt-sql-watchdog", daemon=True
                )
                self._thread.start()
            self._next += 1
            self._alarms[self._next] = (deadline, con)
            if deadline < self._wake_at:  # the thread would wake too late: wake it now
                self._changed.notify()
            return self._next

    def disarm(self, alarm: int) -> None:
        with self._changed:
            self._alarms.pop(alarm, None)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for alarm, (deadline, con) in list(self._alarms.items()):
                    if deadline <= now:
                        del self._alarms[alarm]
                        con.interrupt()
                earliest = min((d for d, _ in self._alarms.values()), default=math.inf)
                self._wake_at = min(earliest, now + _WATCHDOG_TICK_S)
                self._changed.wait(self._wake_at - now)


_WATCHDOG = _Watchdog()


def _count_rest(cursor: duckdb.DuckDBPyConnection, seen: int, count_limit: int) -> int | None:
    """Count the remaining rows (``None`` past ``count_limit``) without keeping them."""
    while seen <= count_limit:
        chunk = cursor.fetchmany(_COUNT_CHUNK)
        if not chunk:
            return seen
        seen += len(chunk)
    return None
