"""Sandbox speed: what a sandboxed tool call costs, next to what peer systems pay.

Measured side by side in one run, with every isolation layer the machine
offers switched on:

- ``persistent``: a trivial snippet in the episode's persistent worker;
- ``fresh_subprocess``: the same snippet in a fresh ``python -c`` per call
  (no sandbox at all: the baseline that peer systems pay per call);
- ``startup``: ``open_session`` -> first result, cold, and with a prestarted
  warm pool (``prestart=1``);
- ``bash``: a trivial command in the persistent bash session.

Prints a Markdown table and writes ``sandbox_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "main", "run_benchmark"]

SNIPPET = "x = 21 * 2\nx"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=200, help="calls per latency series")
    parser.add_argument("--startups", type=int, default=20, help="episodes per start-up series")
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "n": len(samples),
        "p50_ms": pct(0.5) * 1e3,
        "p99_ms": pct(0.99) * 1e3,
        "mean_ms": statistics.fmean(samples) * 1e3,
    }


async def _persistent(tool: Any, repeats: int) -> list[float]:
    session = await tool.open_session(None)
    try:
        await tool.call(session, {"code": SNIPPET})  # warm-up
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = await tool.call(session, {"code": SNIPPET})
            samples.append(time.perf_counter() - start)
            assert result.text == "42", result
        return samples
    finally:
        await tool.close_session(session)


def _fresh_subprocess(repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", "x = 21 * 2\nprint(x)"], capture_output=True)
        samples.append(time.perf_counter() - start)
        assert out.stdout.strip() == b"42"
    return samples


async def _startup(tool: Any, episodes: int) -> list[float]:
    samples = []
    for _ in range(episodes):
        if getattr(tool, "_pool", None) is not None:
            await asyncio.sleep(0.3)  # let the pool refill, as it would while a prompt renders
        start = time.perf_counter()
        session = await tool.open_session(None)
        result = await tool.call(session, {"code": SNIPPET})
        samples.append(time.perf_counter() - start)
        assert result.text == "42", result
        await tool.close_session(session)
    return samples


async def _bash(tool: Any, repeats: int) -> list[float]:
    session = await tool.open_session(None)
    try:
        await tool.call(session, {"command": "true"})
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = await tool.call(session, {"command": "echo 42"})
            samples.append(time.perf_counter() - start)
            assert result.text.startswith("42"), result
        return samples
    finally:
        await tool.close_session(session)


async def run_benchmark(repeats: int, startups: int) -> dict[str, Any]:
    """Run every series; returns the JSON-ready report."""
    from vt_envs.tools.bash import BashTool
    from vt_envs.tools.python import PythonTool

    python = PythonTool(timeout_s=30)
    warm = PythonTool(timeout_s=30, prestart=1)
    bash = BashTool(timeout_s=30)
    try:
        series = {
            "persistent": _stats(await _persistent(python, repeats)),
            "fresh_subprocess": _stats(_fresh_subprocess(repeats)),
            "startup_cold": _stats(await _startup(python, startups)),
            "startup_prestarted": _stats(await _startup(warm, startups)),
            "bash": _stats(await _bash(bash, repeats)),
        }
    finally:
        await warm.aclose()
    return {
        "series": series,
        "speedup_p50": series["fresh_subprocess"]["p50_ms"] / series["persistent"]["p50_ms"],
        "isolation": {"backend": python.isolation.backend, "layers": list(python.isolation.layers)},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "repeats": repeats,
        "startups": startups,
    }


def render(report: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    rows = ["| series | n | p50 (ms) | p99 (ms) | mean (ms) |", "|---|---:|---:|---:|---:|"]
    for name, s in report["series"].items():
        rows.append(
            f"| {name} | {s['n']} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['mean_ms']:.2f} |"
        )
    rows.append("")
    rows.append(
        f"Persistent worker vs fresh `python -c` per call (p50): "
        f"**{report['speedup_p50']:.0f}x** faster."
    )
    rows.append(
        f"Isolation: {report['isolation']['backend']} — {', '.join(report['isolation']['layers'])}."
    )
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = asyncio.run(run_benchmark(args.repeats, args.startups))
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sandbox_speed.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0
