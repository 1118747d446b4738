"""SQLTool: read-only DuckDB queries for an agent, one connection per episode.

Each episode opens its task's database (``task.assets["db_path"]``) with
:func:`~vt_envs.domains.sql.databases.connect_readonly`; every call runs one
read-only statement in a worker thread with a timeout enforced by
``interrupt()`` (see :mod:`vt_envs.domains.sql.execution`) and returns the
result as a compact text table, cut at ``max_rows`` rows and ``max_chars``
characters with a note saying how much was cut. Every failure — bad SQL, a
write attempt, a timeout — is a :class:`ToolResult` with ``ok=False``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import duckdb

from vt_envs.core.tool import Tool, ToolResult
from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.execution import QueryOutcome, execute_query
from vt_envs.domains.sql.schema import format_value
from vt_envs.errors import InvalidConfigError

__all__ = ["SQLTool", "render_table"]

# Rows past the shown ones are counted (not kept) up to this many, for the note.
_COUNT_LIMIT = 10_000


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


class SQLTool(Tool):
    """Run one read-only SQL query on the episode's DuckDB database.

    Args:
        timeout_s: per-query time limit (enforced inside DuckDB with interrupt()).
        max_rows: rows shown per result.
        max_chars: characters of the rendered table (the note is added after).
        max_cell_chars: long values are cut to this length.
    """

    name = "sql"
    description = (
        "Run one read-only SQL query (DuckDB dialect) on the database and see the "
        "result table or the error."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "one SQL statement"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    tag_argument = "query"

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        max_rows: int = 50,
        max_chars: int = 9000,
        max_cell_chars: int = 60,
    ):
        if max_rows < 1 or max_chars < 100 or max_cell_chars < 4:
            raise InvalidConfigError(
                "SQLTool needs max_rows >= 1, max_chars >= 100 and max_cell_chars >= 4; got "
                f"max_rows={max_rows}, max_chars={max_chars}, max_cell_chars={max_cell_chars}"
            )
        super().__init__(timeout_s=timeout_s)
        self.max_rows, self.max_chars, self.max_cell_chars = max_rows, max_chars, max_cell_chars

    async def open_session(self, task: Any, *, seed: int = 0) -> dict[str, Any]:
        path = task.assets.get("db_path") if task is not None else None
        if not path:
            raise InvalidConfigError(
                f"task {getattr(task, 'id', None)!r} has no assets['db_path']; SQL tasks must "
                "name the DuckDB file to query"
            )
        return {"con": connect_readonly(path)}

    async def close_session(self, session: Any) -> None:
        if not session:
            return
        await _settle(session, interrupt=True)
        con = session.pop("con", None)
        if con is not None:
            con.close()

    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        limit = self.timeout_s if timeout_s is None else timeout_s
        con: duckdb.DuckDBPyConnection = session["con"]
        # One query at a time per connection: wait for the previous one (an
        # interrupted query may still be unwinding in its thread).
        await _settle(session, interrupt=False)
        running = asyncio.ensure_future(
            asyncio.to_thread(
                execute_query,
                con,
                arguments["query"],
                timeout_s=limit,
                max_rows=self.max_rows,
                count_limit=_COUNT_LIMIT,
            )
        )
        session["running"] = running
        try:
            # Shielded: cancelling the call must not orphan the thread; the query is
            # interrupted, and recover_session / the next call wait for it to stop.
            outcome = await asyncio.shield(running)
        except asyncio.CancelledError:
            con.interrupt()
            raise
        return self._result(outcome, limit)

    async def recover_session(self, session: Any) -> None:
        """After a cancelled call: interrupt its query and wait for its thread."""
        if session:
            await _settle(session, interrupt=True)

    def _result(self, outcome: QueryOutcome, limit: float) -> ToolResult:
        if not outcome.ok:
            if outcome.error == "timeout":
                text = f"Error: the query was stopped after {limit:.3g} s (timeout)."
            else:
                text = f"Error ({outcome.error}): {outcome.message}"
            return ToolResult.failure(text, outcome.error or "error", exec_s=outcome.exec_s)
        text = render_table(
            outcome.columns,
            outcome.rows,
            outcome.total_rows,
            max_chars=self.max_chars,
            max_cell_chars=self.max_cell_chars,
            count_limit=_COUNT_LIMIT,
        )
        truncated = text.rsplit("\n", 1)[-1].startswith("(showing")
        return ToolResult(
            text,
            metrics={
                "rows": float(len(outcome.rows)),
                "exec_s": outcome.exec_s,
                "truncated": float(truncated),
            },
        )


async def _settle(session: dict[str, Any], *, interrupt: bool) -> None:
    """Wait until the session's last query thread has finished (interrupting it first)."""
    running = session.get("running")
    if running is not None and not running.done():
        if interrupt:
            session["con"].interrupt()
        await asyncio.wait([running])
