"""Execution match: the final SQL scores 1.0 when it returns what the gold SQL returns.

Both queries run on the task's database in a sandboxed SQL worker
(:mod:`vt_envs.domains.sql.worker`), through the same read-only, allow-listed,
time-limited path as the agent's tool; the results are compared there too, so
no result of the model's SQL ever reaches the host. In an episode with a
local SQL tool that worker is the episode's own: an answer whose SQL the
agent already ran is graded on the result it saw, without running it again. Results are compared as
multisets of rows — as ordered lists only when the gold query has a top-level
``ORDER BY`` (Spider's rule) — with a float tolerance; optionally the columns
may come in any order (:func:`~vt_envs.domains.sql.results.results_match`).
A final query that fails, times out, is refused, or kills its worker scores 0.

The gold SQL is never shown to the agent and never put in ``info``: the
score's ``parts`` are numbers, and its ``detail`` (for transcripts) names
only error kinds and row counts.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections import OrderedDict
from typing import Any

from vt_envs.core.task import Task
from vt_envs.core.tool import check_timeout
from vt_envs.core.verifier import NO_TOOLS, EpisodeTools, Score, Verifier
from vt_envs.domains.sql.results import extract_sql, has_top_level_order_by, results_match
from vt_envs.domains.sql.tools import (
    KILL_MARGIN_S,
    SQL_POLICY,
    SQLTool,
    sql_binds,
    worker_options,
)
from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.sandbox.service import ServiceLost, ServicePool, SessionClosed, service_spec
from vt_envs.tools._sandboxed import resolve

# Gold digests the verifier remembers (each with the worker process that computed it).
_GOLD_DIGESTS = 4096
# What the worker replies when the results match (the fast path replies the same).
_MATCH = {"value": 1.0, "parts": {"correct": 1.0, "executed": 1.0}, "detail": "results match"}

__all__ = [
    "ExecutionMatch",
    "extract_sql",
    "has_top_level_order_by",
    "results_match",
]


class ExecutionMatch(Verifier):
    """The VT-SQL verifier: execute the answer and the gold, compare the results.

    ``task.gold`` is the gold SQL; ``task.assets["db_path"]`` the DuckDB file.
    Verifications run in up to ``workers`` sandboxed SQL workers per database
    file, which keep gold results cached (a task is scored many times
    in training). ``await averify(task, answer)`` is the env's entry point;
    calling the verifier runs that on VT's event loop.

    Args:
        timeout_s: time limit of each of the two queries; the worker is killed
            (and the answer scores 0) past ``2 * timeout_s`` plus a margin.
        column_order_insensitive: accept the right columns in another order.
        rel_tol, abs_tol: float tolerance (``math.isclose``).
        max_result_rows: results larger than this score 0 (and gold results
            larger than this are a task bug).
        workers: concurrent verifications per database file, in the whole
            process: the verifiers of every env with the same sandbox share one
            pool of workers per event loop (a thousand remote envs must not
            hold a thousand verifier workers); only verifications outside an
            episode's own worker use it (remote tools, a verifier on its own).
        policy, isolation: the workers' sandbox (default the SQL tool's).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        column_order_insensitive: bool = False,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
        max_result_rows: int = 100_000,
        workers: int = 2,
        policy: SandboxPolicy | None = None,
        isolation: str | None = None,
    ):
        # (the tool's deadline, doubled: not capped again)
        self.timeout_s = check_timeout("timeout_s", timeout_s, limit=math.inf)
        self.column_order_insensitive = column_order_insensitive
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.max_result_rows = max_result_rows
        self.workers = workers
        self.isolation = resolve(policy or SQL_POLICY, isolation)
        service = service_spec("vt_envs.domains.sql.worker", worker_options(self.isolation.policy))
        self._service = service
        self._shared: _SharedPool | None = None
        # (host database, gold, order_matters) -> (the worker process that ran the gold,
        # the digest of its result): see _known_match.
        self._gold_digests: OrderedDict[tuple[str, str, bool], tuple[Any, str]] = OrderedDict()

    async def averify(
        self,
        task: Task,
        answer: str,
        tools: EpisodeTools = NO_TOOLS,
    ) -> Score:
        """Score ``answer`` against ``task``'s gold, in a sandboxed worker.

        With ``tools`` (the running episode's, passed by the env) holding
        a local :class:`SQLTool` session on the task's database, the answer
        is graded in that episode's worker: if the episode already ran the
        answer's exact SQL and kept its complete result, it is graded on the
        result the agent saw instead of running it again. Otherwise (remote
        tools, a verifier called on its own) in the verifier's own workers.

        When the episode's worker process has also verified this gold before
        (in an earlier episode) and the digest of the kept result equals the
        gold's, the answer scores 1.0 without a round trip
        (:meth:`_known_match`).
        """
        binds, db = sql_binds(str(task.assets["db_path"]), self.isolation)
        gold, sql = str(task.gold), extract_sql(answer)
        gold_key = (next(iter(binds.values())), gold, has_top_level_order_by(gold))
        episode = _episode_session(tools, db)
        if episode is not None and self._known_match(gold_key, sql, episode[1]):
            return _score(_MATCH)
        request = {
            "op": "verify",
            "db": db,
            "gold": gold,
            "answer": sql,
            "timeout_s": self.timeout_s,
            "max_result_rows": self.max_result_rows,
            "order_matters": gold_key[2],
            "column_order_insensitive": self.column_order_insensitive,
            "rel_tol": self.rel_tol,
            "abs_tol": self.abs_tol,
        }
        deadline = 2 * self.timeout_s + KILL_MARGIN_S
        try:
            if episode is not None:
                tool, session = episode
                reply = await tool.request_in_session(
                    session, {**request, "episode": True}, deadline
                )
                self._remember_gold(
                    gold_key, getattr(session.get("worker"), "process", None), reply
                )
            else:
                pool = self._pool()
                worker = await pool.acquire(binds)
                try:
                    reply = await worker.request(request, deadline)
                finally:
                    await pool.release(worker)
        except ServiceLost as lost:
            timed_out = float(lost.kind == "timeout")
            parts = {"correct": 0.0, "executed": 0.0, "timeout": timed_out}
            return Score(0.0, parts, f"answer failed: its worker was killed ({lost.kind})")
        except SessionClosed:
            return Score(0.0, {"correct": 0.0, "executed": 0.0}, "the SQL session was closed")
        return _score(reply)

    def _known_match(
        self, gold_key: tuple[str, str, bool], sql: str, session: dict[str, Any]
    ) -> bool:
        """Whether the episode's worker would certainly score ``sql`` 1.0 now.

        True only when the session's live worker process both keeps a complete
        result for ``sql`` this episode and verified this gold itself before,
        and the two digests are equal: the worker would grade the kept result
        against its cached gold, and equal digests make them match exactly
        (:meth:`~vt_envs.domains.sql.results.ResultRows.digests`). Both
        digests come from that one process, so this trusts nothing the worker
        could not already decide by its reply; anything else asks the worker.
        """
        known = self._gold_digests.get(gold_key)
        kept = SQLTool.kept_digests(session, sql)
        if known is None or kept is None:
            return False
        process, digest = known
        if process() is not session["worker"].process:  # kept_digests: it is live
            return False
        return kept[0 if gold_key[2] else 1] == digest

    def _remember_gold(self, gold_key: tuple[str, str, bool], process: Any, reply: Any) -> None:
        digest = reply.get("gold_digest") if isinstance(reply, dict) else None
        if not isinstance(digest, str) or process is None or not process.alive:
            return
        self._gold_digests[gold_key] = (weakref.ref(process), digest)
        self._gold_digests.move_to_end(gold_key)
        while len(self._gold_digests) > _GOLD_DIGESTS:
            self._gold_digests.popitem(last=False)

    def _pool(self) -> ServicePool:
        """The process's shared pool for this verifier's sandbox, on the running loop."""
        loop = asyncio.get_running_loop()
        if self._shared is None or self._shared.loop is not loop:
            if self._shared is not None and self._shared.leave():  # another loop's pool
                _close_on_its_loop(self._shared)
            key = (repr(self.isolation), self.workers)
            pools = _SHARED_POOLS.setdefault(loop, {})
            shared = pools.get(key)
            if shared is None:
                make = ServicePool(self.isolation, self._service, max_per_key=self.workers)
                shared = pools[key] = _SharedPool(make, loop, key)
            shared.users += 1
            self._shared = shared
        return self._shared.pool

    async def aclose(self) -> None:
        """Leave the shared pool; the last verifier to leave stops its workers
        (idempotent)."""
        shared, self._shared = self._shared, None
        if shared is not None and shared.leave():
            await shared.pool.aclose()


class _SharedPool:
    """A verifier worker pool, the loop it belongs to, and how many verifiers use it."""

    def __init__(self, pool: ServicePool, loop: asyncio.AbstractEventLoop, key: tuple):
        self.pool, self.loop, self.key, self.users = pool, loop, key, 0

    def leave(self) -> bool:
        """One user fewer; ``True`` when it was the last (the pool is then unlisted)."""
        self.users -= 1
        if self.users > 0:
            return False
        pools = _SHARED_POOLS.get(self.loop, {})
        if pools.get(self.key) is self:
            del pools[self.key]
        return True


def _close_on_its_loop(shared: _SharedPool) -> None:
    """Stop a pool nobody uses any more from its own loop, if that loop still runs."""
    if shared.loop.is_running() and not shared.loop.is_closed():
        asyncio.run_coroutine_threadsafe(shared.pool.aclose(), shared.loop)


# Event loop -> (sandbox, workers) -> the pool every ExecutionMatch of the process shares.
_SHARED_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _SharedPool]] = (
    weakref.WeakKeyDictionary()
)


def _episode_session(tools: EpisodeTools, db: str) -> tuple[SQLTool, dict[str, Any]] | None:
    """The episode's local SQL tool and its open session on ``db``, if it has one."""
    for tool, session in tools.values():
        if (
            isinstance(tool, SQLTool)
            and isinstance(session, dict)
            and session.get("worker") is not None
            and session.get("db") == db
        ):
            return tool, session
    return None


def _score(reply: Any) -> Score:
    """The worker's score, checked (a malformed reply scores 0)."""
    try:
        parts = {str(k): float(v) for k, v in reply["parts"].items()}
        return Score(float(reply["value"]), parts, str(reply["detail"])[:500])
    except (KeyError, TypeError, ValueError, AttributeError):
        return Score(0.0, {"correct": 0.0, "executed": 0.0}, "answer failed: malformed reply")
