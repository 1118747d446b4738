"""Execution match: the final SQL scores 1.0 when it returns what the gold SQL returns.

Both queries run on the task's database in a sandboxed SQL worker
(:mod:`vt_envs.domains.sql.worker`), through the same read-only, allow-listed,
time-limited path as the agent's tool; the results are compared there too, so
no result of the model's SQL ever reaches the host. Results are compared as
multisets of rows — as ordered lists only when the gold query has a top-level
``ORDER BY`` (Spider's rule) — with a float tolerance; optionally the columns
may come in any order (:func:`~vt_envs.domains.sql.results.results_match`).
A final query that fails, times out, is refused, or kills its worker scores 0.

The gold SQL is never shown to the agent and never put in ``info``: the
score's ``parts`` are numbers, and its ``detail`` (for transcripts) names
only error kinds and row counts.
"""

from __future__ import annotations

from typing import Any

from vt_envs.core.loop import run_sync
from vt_envs.core.task import Task
from vt_envs.core.verifier import Score
from vt_envs.domains.sql.results import extract_sql, has_top_level_order_by, results_match
from vt_envs.domains.sql.tool import KILL_MARGIN_S, SQL_POLICY, sql_binds, worker_options
from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.sandbox.service import ServiceLost, ServicePool, service_spec
from vt_envs.tools._sandboxed import resolve

__all__ = [
    "ExecutionMatch",
    "extract_sql",
    "has_top_level_order_by",
    "results_match",
]


class ExecutionMatch:
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
        workers: concurrent verifications per database file.
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
        self.timeout_s = timeout_s
        self.column_order_insensitive = column_order_insensitive
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.max_result_rows = max_result_rows
        self.workers = workers
        self.isolation = resolve(policy or SQL_POLICY, isolation)
        service = service_spec("vt_envs.domains.sql.worker", worker_options(self.isolation.policy))
        self._workers = ServicePool(self.isolation, service, max_per_key=workers)

    async def averify(self, task: Task, answer: str) -> Score:
        """Score ``answer`` against ``task``'s gold, in a sandboxed worker."""
        binds, db = sql_binds(str(task.assets["db_path"]), self.isolation)
        request = {
            "op": "verify",
            "db": db,
            "gold": str(task.gold),
            "answer": extract_sql(answer),
            "timeout_s": self.timeout_s,
            "max_result_rows": self.max_result_rows,
            "order_matters": has_top_level_order_by(str(task.gold)),
            "column_order_insensitive": self.column_order_insensitive,
            "rel_tol": self.rel_tol,
            "abs_tol": self.abs_tol,
        }
        worker = await self._workers.acquire(binds)
        try:
            reply = await worker.request(request, 2 * self.timeout_s + KILL_MARGIN_S)
        except ServiceLost as lost:
            timed_out = float(lost.kind == "timeout")
            parts = {"correct": 0.0, "executed": 0.0, "timeout": timed_out}
            return Score(0.0, parts, f"answer failed: its worker was killed ({lost.kind})")
        finally:
            await self._workers.release(worker)
        return _score(reply)

    def __call__(self, task: Task, answer: str) -> Score:
        return run_sync(self.averify(task, answer), method="ExecutionMatch", async_method="averify")

    async def aclose(self) -> None:
        """Stop every worker (idempotent)."""
        await self._workers.aclose()


def _score(reply: Any) -> Score:
    """The worker's score, checked (a malformed reply scores 0)."""
    try:
        parts = {str(k): float(v) for k, v in reply["parts"].items()}
        return Score(float(reply["value"]), parts, str(reply["detail"])[:500])
    except (KeyError, TypeError, ValueError, AttributeError):
        return Score(0.0, {"correct": 0.0, "executed": 0.0}, "answer failed: malformed reply")
