"""The SQL worker: runs inside a sandbox, serving one episode at a time (or the verifier).

Started by :class:`~vt_envs.sandbox.service.ServiceSession` in the sandbox's
``service`` mode, which imports this module without ``vt_envs``'s package
``__init__``: it needs only DuckDB, :mod:`~vt_envs.domains.sql.execution` and
:mod:`~vt_envs.domains.sql.results`.

Everything the model's SQL can make expensive happens here, never in the host:
parsing, planning, execution, fetching, rendering and comparing results. The
host sees only small replies (a rendered, capped table; a score), and kills
this process when a request overruns its deadline or the process outgrows the
sandbox's memory limits.

Requests (JSON objects):

- ``{"op": "reset"}``: a new episode starts; the previous episode's
  connections and kept results are dropped (their temporary state with them);
- ``{"op": "query", "db", "sql", "timeout_s", "max_rows", "max_chars",
  "max_cell_chars", "count_limit"[, "new_episode"]}`` → ``{"ok", "error",
  "text", "rows", "truncated", "exec_s", "kept", "digests"}``: the table as
  the agent reads it, or the error, on the episode's own connection.
  ``new_episode`` resets first (the host sends it with an episode's first
  request instead of a separate reset). A complete result (at most
  ``count_limit`` rows) is kept for the episode, keyed by its SQL
  (``kept``), with its ordered and multiset digests
  (:meth:`~vt_envs.domains.sql.results.ResultRows.digests`, or ``None``);
- ``{"op": "verify", "db", "gold", "answer", "timeout_s", "max_result_rows",
  "order_matters", "column_order_insensitive", "rel_tol", "abs_tol"[,
  "episode", "new_episode"]}`` → ``{"value", "parts", "detail"[,
  "gold_digest"]}``: the execution match of the answer with the gold (gold
  results are cached per worker), and the gold result's digest under
  ``order_matters`` once the gold ran. With ``episode``, an answer whose
  exact SQL this episode already ran is graded on the result the agent saw
  instead of running it again; the host grades such an answer itself when
  this process's digests of both are equal (the verifier's fast path).

One read-only connection per database (``options["memory_limit"]``, one
thread) keeps the database open for the worker's life; each episode queries
through its own connection to it (``cursor()``), closed at the next reset, so
nothing an episode creates reaches the next one. A worker serves one episode
at a time; the host kills it when a query overruns or exhausts it.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from vt_envs.domains.sql.execution import QueryOutcome, connect_readonly, execute_query
from vt_envs.domains.sql.results import (
    EPISODE_RESULTS,
    ResultRows,
    render_table,
    results_match,
)

__all__ = ["serve"]

_GOLD_CACHE_SIZE = 512
# Complete results an episode keeps for its verification (EPISODE_RESULTS, the latest
# queries), each at most about _KEPT_BYTES: they stay far below the worker's memory limit.
_KEPT_BYTES = 8 << 20


def serve(options: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Return the request handler of one worker process."""
    connections: dict[str, Any] = {}
    episode: dict[str, Any] = {}  # the current episode's connections
    # The current episode's complete results by (db, SQL), for its verification.
    seen: OrderedDict[tuple[str, str], ResultRows] = OrderedDict()
    gold_cache: OrderedDict[tuple[str, str], ResultRows] = OrderedDict()

    def connection(db: str):
        if db not in connections:
            connections[db] = connect_readonly(
                db, memory_limit=options.get("memory_limit"), threads=options.get("threads", 1)
            )
        return connections[db]

    def episode_connection(db: str):
        if db not in episode:
            episode[db] = connection(db).cursor()
        return episode[db]

    def reset(request: dict[str, Any]) -> dict[str, Any]:
        for con in episode.values():
            con.close()
        episode.clear()
        seen.clear()
        return {"ok": True}

    def query(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("new_episode"):
            reset(request)
        max_rows = int(request["max_rows"])
        # Rows past the shown ones are fetched to be counted anyway: they are kept.
        outcome = execute_query(
            episode_connection(request["db"]),
            request["sql"],
            timeout_s=float(request["timeout_s"]),
            max_rows=max_rows,
            count_limit=int(request["count_limit"]),
            keep_counted=True,
        )
        if not outcome.ok:
            return {
                "ok": False,
                "error": outcome.error,
                "text": outcome.message,
                "rows": 0,
                "truncated": False,
                "exec_s": outcome.exec_s,
            }
        kept, digests = False, None
        if outcome.total_rows is not None and _small(outcome.rows):
            key = (request["db"], request["sql"].strip())
            seen[key] = rows = _result_rows(outcome)
            seen.move_to_end(key)
            while len(seen) > EPISODE_RESULTS:
                seen.popitem(last=False)
            kept, digests = True, rows.digests()
        text = render_table(
            outcome.columns,
            outcome.rows[:max_rows],
            outcome.total_rows,
            max_chars=int(request["max_chars"]),
            max_cell_chars=int(request["max_cell_chars"]),
            count_limit=int(request["count_limit"]),
        )
        truncated = text.rsplit("\n", 1)[-1].startswith("(showing")
        return {
            "ok": True,
            "error": None,
            "text": text,
            "rows": min(len(outcome.rows), max_rows),
            "truncated": truncated,
            "exec_s": outcome.exec_s,
            "kept": kept,
            "digests": digests,
        }

    def run(request: dict[str, Any], sql: str) -> QueryOutcome:
        return execute_query(
            connection(request["db"]),
            sql,
            timeout_s=float(request["timeout_s"]),
            count_limit=int(request["max_result_rows"]),
        )

    def gold_result(request: dict[str, Any]) -> ResultRows | QueryOutcome:
        """The gold's rows (cached), or its failed outcome."""
        key = (request["db"], request["gold"])
        if key in gold_cache:
            gold_cache.move_to_end(key)
            return gold_cache[key]
        outcome = run(request, request["gold"])
        if not outcome.ok:
            return outcome
        gold_cache[key] = rows = _result_rows(outcome)
        while len(gold_cache) > _GOLD_CACHE_SIZE:
            gold_cache.popitem(last=False)
        return rows

    def answer_result(request: dict[str, Any]) -> ResultRows | QueryOutcome:
        """The answer's rows: those this episode saw for the same SQL, else a fresh run."""
        if request.get("episode"):
            kept = seen.get((request["db"], request["answer"].strip()))
            if kept is not None and len(kept.rows) <= int(request["max_result_rows"]):
                return kept
        outcome = run(request, request["answer"])
        return _result_rows(outcome) if outcome.ok else outcome

    def verify(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("new_episode"):  # no query ran this episode: nothing kept is its own
            reset(request)
        gold = gold_result(request)
        if isinstance(gold, QueryOutcome):
            # A broken gold is a dataset bug, not the agent's fault; it still scores 0.
            return _score(0.0, False, f"gold failed: {gold.error}")
        order_matters = bool(request["order_matters"])
        pred = answer_result(request)
        if isinstance(pred, QueryOutcome):
            return _score(0.0, False, f"answer failed: {pred.error}", gold, order_matters)
        match = results_match(
            gold,
            pred,
            order_matters=order_matters,
            column_order_insensitive=bool(request["column_order_insensitive"]),
            rel_tol=float(request["rel_tol"]),
            abs_tol=float(request["abs_tol"]),
        )
        if match:
            return _score(1.0, True, "results match", gold, order_matters)
        return _score(
            0.0,
            True,
            f"results differ ({len(pred.rows)} rows x {pred.width} columns vs "
            f"{len(gold.rows)} x {gold.width} expected)",
            gold,
            order_matters,
        )

    handlers = {"reset": reset, "query": query, "verify": verify}

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        return handlers[request["op"]](request)

    handle.gold_cache = gold_cache  # type: ignore[attr-defined]  (for inspection)
    handle.episode_connection = episode_connection  # type: ignore[attr-defined]
    return handle


def _result_rows(outcome: QueryOutcome) -> ResultRows:
    return ResultRows(outcome.rows, len(outcome.columns))


def _small(rows: tuple[tuple, ...]) -> bool:
    """Whether ``rows`` take ``_KEPT_BYTES`` or less (values' sizes summed, stopping
    past the bound; a fraction of what fetching them cost)."""
    size = 0
    for row in rows:
        size += _row_bytes(row)
        if size > _KEPT_BYTES:
            return False
    return True


def _row_bytes(row: tuple) -> int:
    return sys.getsizeof(row) + sum(sys.getsizeof(v) for v in row)


def _score(
    value: float,
    executed: bool,
    detail: str,
    gold: ResultRows | None = None,
    order_matters: bool = False,
) -> dict[str, Any]:
    reply = {
        "value": value,
        "parts": {"correct": value, "executed": float(executed)},
        "detail": detail,
    }
    if gold is not None:
        reply["gold_digest"] = gold.digest(order_matters)
    return reply
