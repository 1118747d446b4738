"""Server speed: what running tools behind ``vt-tool-server`` costs, on loopback.

Starts a server (``--workers`` processes) and measures, in one run:

- ``overhead``: ``env.step`` of the same tool call through ``gym.make(id)`` and
  ``gym.make(id, tool_server=URL)``, alternating local and remote every
  step: VT-Lookup-v0's ``lookup`` (a dictionary read: the cost is the
  service itself) and VT-Math-v0's ``python`` (a sandboxed call), p50/p99 and
  the added p50;
- ``throughput``: calls/s of ``lookup`` sessions at 1, 8, 64 and 512 calls in
  flight from one client process (one session per in-flight call);
- ``ray_vs_local``: batch steps/s of a VT-Math-v0 vector env with its sub-envs in
  this process and in two Ray actors (when Ray is installed).

Prints Markdown and writes ``server_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vt_bench.stats import latency_summary

__all__ = ["add_arguments", "main", "render", "run_benchmark", "start_tool_server"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=200, help="steps per side and tool")
    parser.add_argument("--calls", type=int, default=2000, help="calls per concurrency level")
    parser.add_argument("--inflight", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for JSON")


# The server's token: made per run, handed to the server and to this process's clients.
_TOKEN = secrets.token_hex(16)


def start_tool_server(
    workers: int, env_ids: Sequence[str], *, max_inflight: int = 1024
) -> tuple[subprocess.Popen, str, str]:
    """Start ``vt-tool-server`` (``workers`` processes, serving ``env_ids``) on a free
    loopback port; wait until every worker answers. Returns the process, its URL and
    its token (made for this run)."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    envs = [arg for env_id in env_ids for arg in ("--env", env_id)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vt_envs.server.cli", "--port", str(port), "--workers",
         str(workers), "--max-inflight", str(max_inflight), *envs],
        stdout=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "VT_TOOL_SERVER_TOKEN": _TOKEN},
    )  # fmt: skip
    deadline = time.monotonic() + 60
    for i in range(workers):
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port + i}/health", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError("vt-tool-server did not start") from None
                time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}", _TOKEN


def _overhead(url: str, env_id: str, action: str, steps: int) -> dict[str, Any]:
    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)

    sides = {"local": gym.make(env_id, split="test"),
             "remote": gym.make(env_id, split="test", tool_server=url,
                                tool_server_token=_TOKEN)}  # fmt: skip
    times: dict[str, list[float]] = {"local": [], "remote": []}
    try:
        for env in sides.values():
            env.reset(seed=0)
            env.step(action.format(key=env.unwrapped.task.metadata.get("key", "")))  # warm-up
        for i in range(steps):
            order = ("local", "remote") if i % 2 == 0 else ("remote", "local")
            for side in order:
                env = sides[side]
                if i % 3 == 0:  # a fresh episode now and then: turn budgets stay unspent
                    env.reset(seed=i)
                call = action.format(key=env.unwrapped.task.metadata.get("key", ""))
                start = time.perf_counter()
                _, _, terminated, truncated, info = env.step(call)
                times[side].append(time.perf_counter() - start)
                if not info["tool"]["ok"]:
                    raise RuntimeError(f"{side} {env_id} call failed: {info['tool']}")
                if terminated or truncated:
                    env.reset(seed=i)
    finally:
        for env in sides.values():
            env.close()
    local, remote = latency_summary(times["local"]), latency_summary(times["remote"])
    return {"local": local, "remote": remote, "added_p50_ms": remote["p50_ms"] - local["p50_ms"]}


async def _throughput(url: str, calls: int, inflight: int) -> dict[str, Any]:
    import vt_envs
    from vt_envs.tools.remote.client import attach_tool_server

    env = vt_envs.make("VT-Lookup-v0", split="test")
    attach_tool_server(env, url, env_id="VT-Lookup-v0", env_kwargs={"split": "test"}, token=_TOKEN)
    tool, task = env.tools["lookup"], env.tasks[0]
    try:
        sessions = await asyncio.gather(*(
            tool.open_session(task, seed=i)  # one session per episode id, same task
            for i in range(inflight)
        ))  # fmt: skip
        per_session = max(calls // inflight, 1)
        failures = 0

        async def worker(session: Any) -> None:
            nonlocal failures
            for _ in range(per_session):
                result = await tool.call(session, {"key": task.metadata["key"]}, timeout_s=30)
                failures += not result.ok

        start = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in sessions))
        wall = time.perf_counter() - start
        await asyncio.gather(*(tool.close_session(s) for s in sessions))
    finally:
        await tool.aclose()
        env.close()
    done = per_session * inflight
    return {"inflight": inflight, "calls": done, "calls_per_s": done / wall, "failures": failures}


def _vector_steps(backend: str, num_envs: int, steps: int) -> float:
    """Batch steps/s of VT-Math-v0 sub-envs (a python call, then the answer, resets
    included) with the sub-envs here or in Ray actors."""
    import vt_envs

    options = {"ray_options": {"actors": 2}} if backend == "ray" else {}
    venv = vt_envs.make_vec("VT-Math-v0", num_envs, backend=backend, split="test", **options)
    try:
        venv.reset(seed=0)
        actions = ["<python>print(6 * 7)</python>", "<answer>42</answer>"]
        venv.step([actions[0]] * num_envs)  # warm-up
        start = time.perf_counter()
        for i in range(steps):
            venv.step([actions[(i + 1) % 2]] * num_envs)
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        venv.close()


def _ray_vs_local(num_envs: int, steps: int) -> dict[str, Any] | None:
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    try:
        rates = {b: _vector_steps(b, num_envs, steps) for b in ("local", "ray")}
    finally:
        ray.shutdown()
    return {"num_envs": num_envs, "steps": steps,
            **{f"{b}_steps_per_s": r for b, r in rates.items()}}  # fmt: skip


def run_benchmark(steps: int, calls: int, inflight: list[int], workers: int) -> dict[str, Any]:
    proc, url, _ = start_tool_server(workers, ("VT-Lookup-v0", "VT-Math-v0"))
    try:
        overhead = {
            "lookup": _overhead(url, "VT-Lookup-v0", "<lookup>{key}</lookup>", steps),
            "python": _overhead(url, "VT-Math-v0", "<python>print(6 * 7)</python>", steps),
        }
        throughput = [asyncio.run(_throughput(url, calls, n)) for n in inflight]
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=15)
    ray_vs_local = _ray_vs_local(8, max(steps // 10, 4))
    return {"workers": workers, "overhead": overhead, "throughput": throughput,
            "ray_vs_local": ray_vs_local}  # fmt: skip


def render(report: dict[str, Any]) -> str:
    rows = [
        "| tool call via env.step | local p50 / p99 (ms) | remote p50 / p99 (ms) "
        "| added p50 (ms) |",
        "|---|---:|---:|---:|",
    ]
    for tool, m in report["overhead"].items():
        rows.append(
            f"| {tool} | {m['local']['p50_ms']:.2f} / {m['local']['p99_ms']:.2f} | "
            f"{m['remote']['p50_ms']:.2f} / {m['remote']['p99_ms']:.2f} | "
            f"{m['added_p50_ms']:.2f} |"
        )
    rows += ["", f"`lookup` calls through {report['workers']} server workers, one client process:",
             "", "| in flight | calls | calls/s | failed |", "|---:|---:|---:|---:|"]  # fmt: skip
    for t in report["throughput"]:
        rows.append(
            f"| {t['inflight']} | {t['calls']} | {t['calls_per_s']:,.0f} | {t['failures']} |"
        )
    r = report.get("ray_vs_local")
    if r:
        rows += ["", f"VT-Math-v0 vector env, {r['num_envs']} sub-envs (a python call, then the "
                 f"answer): local {r['local_steps_per_s']:.1f} sub-env steps/s, Ray actors "
                 f"{r['ray_steps_per_s']:.1f}."]  # fmt: skip
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(args.steps, args.calls, args.inflight, args.workers)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "server_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0
