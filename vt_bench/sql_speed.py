"""SQL speed: VT-SQL-v0 env steps per second with the oracle, and the embedded databases.

Measured in one run:

- ``databases``: for each embedded database, the cold build time (into a
  fresh cache directory), the file size and the table/row counts;
- ``env``: steps/s of the oracle (one exploration query, then the gold
  answer, which the verifier executes) on warmed-up test tasks; ``--repeats``
  runs of ``--episodes`` episodes each, reported as the median (and min/max);
- ``latency``: p50/p99 of a tool call (``SELECT * FROM <table> LIMIT 3``) in
  the episode's sandboxed SQL worker, of the same query run in the host
  process (``in_process``: the path VT used before the workers, for the cost
  of the boundary), of one verification (answer + cached gold, in a verifier
  worker), and of an episode's start (a fresh worker, up to its first answer);
  and the two floors of a tool call: ``duckdb``, the bare
  ``cursor.execute(query).fetchall()`` in the host (DuckDB's parse, bind,
  optimize and run: the cost no wrapper removes), and ``round_trip``, a no-op
  request (``{"op": "reset"}``) to the episode's sandboxed worker (framing,
  pipes, the worker's loop); and an episode's phases as the peers' SQL
  comparison plays them (``reset``, ``query_step``, ``answer_step``: the gold
  run with the tool, then answered).

Prints Markdown and writes ``sql_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vt_bench.stats import latency_summary

__all__ = ["add_arguments", "main", "run_benchmark"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=60, help="episodes per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the episode series")
    parser.add_argument("--calls", type=int, default=200, help="calls per latency series")
    parser.add_argument(
        "--skip-build", action="store_true", help="use the existing cache; do not time cold builds"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def _database_facts(path: Path) -> dict[str, Any]:
    from vt_envs.domains.sql.databases import connect_readonly

    con = connect_readonly(path)
    try:
        tables = con.execute(
            "SELECT table_name, estimated_size FROM duckdb_tables() ORDER BY table_name"
        ).fetchall()
    finally:
        con.close()
    return {"size_mb": path.stat().st_size / 1e6, "tables": dict(tables)}


def _build_databases(skip_build: bool) -> dict[str, Any]:
    from vt_envs.domains.sql.databases import EMBEDDED_DATABASES, database_path

    facts = {}
    saved = os.environ.get("VT_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cold:
        if not skip_build:
            os.environ["VT_CACHE_DIR"] = cold
        try:
            for name in EMBEDDED_DATABASES:
                start = time.perf_counter()
                path = database_path(name)
                build_s = time.perf_counter() - start
                facts[name] = {"build_s": None if skip_build else build_s, **_database_facts(path)}
        finally:
            if saved is None:
                os.environ.pop("VT_CACHE_DIR", None)
            else:
                os.environ["VT_CACHE_DIR"] = saved
    return facts


def _env_series(episodes: int, repeats: int) -> dict[str, Any]:
    from vt_envs.core.policy import run_episode
    from vt_envs.domains.sql import SQLOracle, make_sql_env

    env = make_sql_env(split="test")
    task_ids = [env.tasks[i % len(env.tasks)].id for i in range(episodes)]
    for task_id in task_ids:  # warm-up: generate the tasks, cache the gold results
        run_episode(env, SQLOracle(), options={"task_id": task_id})
    rates, rewards = [], []
    for _ in range(repeats):
        steps = 0
        start = time.perf_counter()
        for task_id in task_ids:
            result = run_episode(env, SQLOracle(), options={"task_id": task_id})
            steps += result.turns
            rewards.append(result.reward)
        rates.append(steps / (time.perf_counter() - start))
    env.close()
    return {
        "steps_per_s_median": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "episodes_per_repeat": episodes,
        "repeats": repeats,
        "mean_reward": statistics.fmean(rewards),
    }


def _step_latency(calls: int) -> dict[str, Any]:
    """An episode's phases as the peers' SQL comparison plays them: ``reset``, a
    query step (the gold in ``<sql>``), the answer step (the same SQL), on warm
    test tasks (a second pass: gold results and digests known)."""
    from vt_envs.domains.sql import make_sql_env

    env = make_sql_env(split="test")
    tasks = [env.tasks[i % len(env.tasks)] for i in range(min(calls, 40))]
    phases: dict[str, list[float]] = {"reset": [], "query_step": [], "answer_step": []}
    try:
        for i in range(len(tasks) + calls):
            task, warm = tasks[i % len(tasks)], i >= len(tasks)
            start = time.perf_counter()
            env.reset(options={"task_id": task.id})
            queried = time.perf_counter()
            env.step(f"<sql>{task.gold}</sql>")
            answered = time.perf_counter()
            _, reward, *_ = env.step(f"<answer>{task.gold}</answer>")
            assert reward == 1.0, task.id
            if warm:
                phases["reset"].append(queried - start)
                phases["query_step"].append(answered - queried)
                phases["answer_step"].append(time.perf_counter() - answered)
    finally:
        env.close()
    return {name: latency_summary(samples) for name, samples in phases.items()}


async def _tool_latency(calls: int) -> dict[str, Any]:
    from vt_envs.domains.sql import SQLTool, sql_tasks
    from vt_envs.domains.sql.execution import connect_readonly, execute_query
    from vt_envs.domains.sql.results import render_table
    from vt_envs.domains.sql.verifier import ExecutionMatch

    query = "SELECT * FROM flights LIMIT 3"
    task = sql_tasks("test", databases=("flights",))[0]
    tool = SQLTool()
    session = await tool.open_session(task)
    verifier = ExecutionMatch()
    host = connect_readonly(task.assets["db_path"])
    cursor = host.cursor()
    try:
        tool_samples, host_samples, verify_samples = [], [], []
        for _ in range(calls):
            start = time.perf_counter()
            result = await tool.call(session, {"query": query})
            tool_samples.append(time.perf_counter() - start)
            assert result.ok, result.text
            start = time.perf_counter()
            outcome = execute_query(host, query, timeout_s=5.0, max_rows=50, count_limit=10_000)
            render_table(outcome.columns, outcome.rows, outcome.total_rows)
            host_samples.append(time.perf_counter() - start)
            start = time.perf_counter()
            score = await verifier.averify(task, str(task.gold))
            verify_samples.append(time.perf_counter() - start)
            assert score.value == 1.0, score.detail
        start_samples = []
        for _ in range(max(3, calls // 20)):
            start = time.perf_counter()
            fresh = await tool.open_session(task)
            await tool.call(fresh, {"query": "SELECT 1"})
            start_samples.append(time.perf_counter() - start)
            await tool.close_session(fresh)
        duckdb_samples = _timed(calls, lambda: cursor.execute(query).fetchall())
        trip_samples = []
        for _ in range(calls):  # the last measurement: a reset drops the episode's cursor
            start = time.perf_counter()
            await session["worker"].request({"op": "reset"}, 5.0)
            trip_samples.append(time.perf_counter() - start)
    finally:
        cursor.close()
        host.close()
        await tool.close_session(session)
        await verifier.aclose()
    return {
        "tool_call": latency_summary(tool_samples),
        "in_process": latency_summary(host_samples),
        "verify": latency_summary(verify_samples),
        "episode_start": latency_summary(start_samples),
        "duckdb": latency_summary(duckdb_samples),
        "round_trip": latency_summary(trip_samples),
    }


def _timed(calls: int, work) -> list[float]:
    """Seconds of each of ``calls`` runs of ``work()``."""
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return samples


def run_benchmark(
    episodes: int, repeats: int, calls: int, skip_build: bool = False
) -> dict[str, Any]:
    """Run every series; returns the JSON-ready report."""
    databases = _build_databases(skip_build)
    return {
        "databases": databases,
        "env": _env_series(episodes, repeats),
        "latency": {**asyncio.run(_tool_latency(calls)), **_step_latency(calls)},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def render(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    rows = ["| database | build (s) | size (MB) | rows |", "|---|---:|---:|---:|"]
    for name, facts in report["databases"].items():
        build = "cached" if facts["build_s"] is None else f"{facts['build_s']:.2f}"
        rows.append(
            f"| {name} | {build} | {facts['size_mb']:.1f} | {sum(facts['tables'].values()):,} |"
        )
    env = report["env"]
    rows += [
        "",
        f"Oracle on VT-SQL-v0 (test split): **{env['steps_per_s_median']:.0f} steps/s** median "
        f"(min {env['steps_per_s_min']:.0f}, max {env['steps_per_s_max']:.0f}; "
        f"{env['repeats']} x {env['episodes_per_repeat']} episodes, mean reward "
        f"{env['mean_reward']:.2f}).",
        "",
        "| latency | n | p50 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|",
    ]
    for name, s in report["latency"].items():
        rows.append(f"| {name} | {s['n']} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} |")
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(args.episodes, args.repeats, args.calls, args.skip_build)
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sql_speed.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0


if __name__ == "__main__":  # `python -m vt_bench.sql_speed`, before the dispatcher lists it
    import sys

    _parser = argparse.ArgumentParser(prog="python -m vt_bench.sql_speed")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
