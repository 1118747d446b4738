"""SQLTool: read-only DuckDB queries for an agent, run in a sandboxed worker per episode.

Each episode has a SQL worker (:mod:`vt_envs.domains.sql.worker`) to itself:
a sandboxed process — namespaces, rlimits, seccomp, a cgroup as root — that
opens the task's database (``task.assets["db_path"]``, bound read-only into
the sandbox) with :func:`~vt_envs.domains.sql.execution.connect_readonly`,
and gives the episode its own connection to it. Workers are kept between
episodes (a new episode gets a fresh connection; nothing of the last one's
remains) and replaced when a query kills one. Every call runs one allowed
statement with DuckDB's interrupt at the call's deadline, and comes back as a
compact text table, cut at ``max_rows`` rows and ``max_chars`` characters
with a note saying how much was cut.

Nothing the model's SQL does runs in the host process: parsing, planning,
execution and fetching all happen in the worker, which is killed if a query
outlives its deadline by :data:`KILL_MARGIN_S` (DuckDB cannot interrupt every
plan) or outgrows the sandbox's memory. The next query then starts a fresh
worker, so the episode stays responsive.
Every failure — bad SQL, a refused statement, a timeout, a killed worker — is
a :class:`ToolResult` with ``ok=False``.
"""

from __future__ import annotations

import functools
import os
import stat
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from vt_envs.core.tool import Tool, ToolResult
from vt_envs.domains.sql.results import EPISODE_RESULTS, render_table
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.sandbox.service import ServiceLost, ServicePool, SessionClosed, service_spec
from vt_envs.tools._sandboxed import resolve

__all__ = ["KILL_MARGIN_S", "SQL_POLICY", "SQLTool", "render_table", "sql_binds"]

#: The limits of a SQL worker's sandbox. DuckDB's own memory limit is set below
#: the address-space limit, so most blow-ups end as an error, the rest as a kill.
SQL_POLICY = SandboxPolicy(memory_mb=1536, processes=32, workdir_mb=64, max_output_bytes=64 << 10)
#: How long past a query's deadline the host waits before killing its worker.
KILL_MARGIN_S = 0.5
# A fresh worker (sandbox, `import duckdb`) answers its first request well within this.
_START_TIMEOUT_S = 30.0
# Rows past the shown ones are counted (not kept) up to this many, for the note.
_COUNT_LIMIT = 10_000
_DB_DIR = "/tmp/db"
# Episodes one worker serves before it is replaced (each gets its own connection,
# closed after it, so what a worker keeps between episodes is bounded caches).
_MAX_USES = 4096
# Databases one worker binds at most (read-only files; it opens each on first use).
_MAX_DATABASES = 64


def sql_binds(db_path: str, isolation: Isolation) -> tuple[dict[str, str], str]:
    """The read-only bind that shows the database file to a worker, and its path there.

    Raises :class:`InvalidConfigError` when the sandbox's uid could not read
    the file (as root, sandboxes run as an unprivileged uid).
    """
    return _sql_binds(db_path, isolation.drops_uid)


@functools.lru_cache(maxsize=256)
def _sql_binds(db_path: str, drops_uid: bool) -> tuple[dict[str, str], str]:
    # Cached: a task's database is resolved at every reset and every verification.
    host = os.path.realpath(db_path)
    if not os.path.isfile(host):
        raise InvalidConfigError(f"the database file {db_path!r} does not exist")
    if drops_uid and not os.stat(host).st_mode & stat.S_IROTH:
        raise InvalidConfigError(
            f"the database file {db_path!r} is not world-readable, so the SQL worker's "
            f"unprivileged uid cannot open it; make it readable: chmod o+r {host!r}"
        )
    inside = f"{_DB_DIR}/{os.path.basename(host)}"
    return {inside: host}, inside


def worker_options(policy: SandboxPolicy) -> dict[str, Any]:
    """DuckDB's settings in a worker: one thread, a memory limit under the rlimit."""
    return {"memory_limit": f"{policy.memory_mb * 6 // 10}MB", "threads": 1}


class SQLTool(Tool):
    """Run one read-only SQL query on the episode's DuckDB database, in a sandbox.

    Args:
        timeout_s: per-query time limit (DuckDB's interrupt; the worker is
            killed at ``timeout_s + KILL_MARGIN_S``).
        max_rows: rows shown per result.
        max_chars: characters of the rendered table (the note is added after).
        max_cell_chars: long values are cut to this length.
        policy: the worker's sandbox limits (default :data:`SQL_POLICY`).
        isolation: shortcut for ``policy.isolation``.
        databases: database files every worker binds from its start (up to
            64), so an env whose tasks span them keeps one worker from its
            first episode on. A task's other database is bound when first
            needed: a new worker takes over the idle one's databases plus it.

    Raises:
        SandboxUnavailableError: no isolation layer works here.
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
        policy: SandboxPolicy | None = None,
        isolation: str | None = None,
        databases: Sequence[str | os.PathLike[str]] = (),
    ):
        if max_rows < 1 or max_chars < 100 or max_cell_chars < 4:
            raise InvalidConfigError(
                "SQLTool needs max_rows >= 1, max_chars >= 100 and max_cell_chars >= 4; got "
                f"max_rows={max_rows}, max_chars={max_chars}, max_cell_chars={max_cell_chars}"
            )
        super().__init__(timeout_s=timeout_s)
        self.max_rows, self.max_chars, self.max_cell_chars = max_rows, max_chars, max_cell_chars
        self.isolation = resolve(policy or SQL_POLICY, isolation)
        service = service_spec("vt_envs.domains.sql.worker", worker_options(self.isolation.policy))
        self._prebound: dict[str, str] = {}
        for path in list(databases)[:_MAX_DATABASES]:
            self._prebound.update(sql_binds(str(path), self.isolation)[0])
        # One worker binds every database its episodes have used (up to _MAX_DATABASES),
        # so an env whose tasks span databases keeps one worker, not one per database.
        self._workers = ServicePool(
            self.isolation, service, max_uses=_MAX_USES, widen_binds=_MAX_DATABASES
        )

    def describe(self) -> dict[str, object]:
        """Which sandbox layers are in force for the SQL workers."""
        return self.isolation.describe()

    async def open_session(self, task: Any, *, seed: int = 0) -> dict[str, Any]:
        path = task.assets.get("db_path") if task is not None else None
        if not path:
            raise InvalidConfigError(
                f"task {getattr(task, 'id', None)!r} has no assets['db_path']; SQL tasks must "
                "name the DuckDB file to query"
            )
        binds, db = sql_binds(str(path), self.isolation)
        worker = await self._workers.acquire({**self._prebound, **binds})
        if worker.process is not None and worker.process.alive:
            # A kept worker: the episode's first request resets it (no round trip now).
            return {"worker": worker, "db": db, "new_episode": True}
        try:
            try:  # start the worker (within the start-up allowance, not a query's deadline)
                await worker.request({"op": "reset"}, _START_TIMEOUT_S)
            except ServiceLost:  # its process died at start: it starts afresh on this retry
                await worker.request({"op": "reset"}, _START_TIMEOUT_S)
        except BaseException:
            await self._workers.release(worker)
            raise
        return {"worker": worker, "db": db, "new_episode": False}

    async def request_in_session(
        self, session: Any, request: dict[str, Any], timeout_s: float
    ) -> Any:
        """Send ``request`` to the episode's worker; its first request of the
        episode also resets it. Raises :class:`ServiceLost` / :class:`SessionClosed`."""
        worker = session.get("worker") if session else None
        if worker is None:
            raise SessionClosed
        if session.get("new_episode"):
            request = {**request, "new_episode": True}
        reply = await worker.request(request, timeout_s)
        session["new_episode"] = False
        return reply

    async def close_session(self, session: Any) -> None:
        if session and session.get("worker") is not None:
            worker, session["worker"] = session["worker"], None
            await self._workers.release(worker)

    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        limit = self.deadline(timeout_s)
        request = {
            "op": "query",
            "db": session["db"],
            "sql": str(arguments["query"]),
            "timeout_s": limit,
            "max_rows": self.max_rows,
            "max_chars": self.max_chars,
            "max_cell_chars": self.max_cell_chars,
            "count_limit": _COUNT_LIMIT,
        }
        try:
            reply = await self.request_in_session(session, request, limit + KILL_MARGIN_S)
            _keep_digests(session, request["sql"], reply)
            return self._result(reply, limit)
        except ServiceLost as lost:
            return _lost(lost, limit)
        except SessionClosed:
            return ToolResult.failure("Error: the database session is closed.", "closed")

    def _result(self, reply: Any, limit: float) -> ToolResult:
        if not (
            isinstance(reply, dict)
            and isinstance(reply.get("ok"), bool)
            and isinstance(reply.get("text"), str)
            and isinstance(reply.get("rows"), int)
        ):
            return _lost(ServiceLost("crashed", "a malformed reply"), limit)
        metrics = {"exec_s": float(reply.get("exec_s") or 0.0)}
        if not reply["ok"]:
            error = str(reply.get("error") or "error")
            if error == "timeout":
                text = f"Error: the query was stopped after {limit:.3g} s (timeout)."
            else:
                text = f"Error ({error}): {reply['text']}"
            return ToolResult.failure(text, error, **metrics)
        metrics.update(rows=float(reply["rows"]), truncated=float(bool(reply.get("truncated"))))
        return ToolResult(reply["text"][: self.max_chars + 200], metrics=metrics)

    async def aclose(self) -> None:
        await self._workers.aclose()

    @staticmethod
    def kept_digests(session: Any, sql: str) -> tuple[str, str] | None:
        """The digests (:meth:`ResultRows.digests`) of the complete result the
        episode's worker keeps for ``sql`` (stripped), or ``None``.

        Only while the worker process that ran it is the session's live one
        (a restarted worker keeps nothing), and only for the SQL the worker
        keeps too: the latest :data:`EPISODE_RESULTS` kept results, updated
        by the same rule.
        """
        kept = session.get("kept") if isinstance(session, dict) else None
        entry = kept.get(sql.strip()) if kept else None
        if entry is None:
            return None
        process, digests = entry
        current = session["worker"].process if session.get("worker") is not None else None
        if current is None or process() is not current or not current.alive:
            return None
        return digests


def _keep_digests(session: dict[str, Any], sql: str, reply: Any) -> None:
    """Mirror the worker's kept results: ``sql``'s digests if it kept its result
    (``None`` when that result has none: it still takes a place)."""
    process = getattr(session.get("worker"), "process", None)
    if process is None or not (
        isinstance(reply, dict) and reply.get("ok") is True and reply.get("kept") is True
    ):
        return
    digests = reply.get("digests")
    valid = (
        isinstance(digests, list) and len(digests) == 2 and all(isinstance(d, str) for d in digests)
    )
    kept = session.setdefault("kept", OrderedDict())
    key = sql.strip()
    kept[key] = (weakref.ref(process), tuple(digests) if valid else None)
    kept.move_to_end(key)
    while len(kept) > EPISODE_RESULTS:
        kept.popitem(last=False)


def _lost(lost: ServiceLost, limit: float) -> ToolResult:
    if lost.kind == "timeout":
        return ToolResult.failure(
            f"Error: the query did not stop at its {limit:.3g} s deadline, so its worker was "
            "killed; the next query runs in a fresh one (timeout).",
            "timeout",
            restarted=1.0,
        )
    return ToolResult.failure(
        "Error: the query exhausted the SQL worker's memory (or crashed it), so the worker was "
        "killed; the next query runs in a fresh one.",
        "out_of_memory",
        restarted=1.0,
    )
