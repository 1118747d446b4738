"""Math speed: VT-Math-v0 env steps per second with the oracle, and the verifier's two paths.

Measured in one run:

- ``env``: steps/s of the oracle (one python call that computes the answer,
  then the boxed answer, which the verifier checks) on the test split;
  ``--repeats`` runs of ``--episodes`` episodes on one env, resets (and so
  sandbox start-ups) included, reported as the median (and min/max). A step
  is one ``env.step``;
- ``python``: p50/p90/p99 of the python tool's latency inside those
  episodes, as the env reports it (``info["tool"]["latency_s"]``);
- ``verifier``: one comparison on the exact in-process path (plain numbers
  and fractions), next to the math-verify worker (symbolic equivalence, in a
  separate process) on a few answer pairs, and the worker's first call
  including its start-up. The ratio says what the exact path saves.

Prints Markdown and writes ``math_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from vt_bench.stats import percentile

__all__ = ["WORKER_PAIRS", "add_arguments", "main", "render", "run_benchmark"]

EXACT_PAIR = ("3/7", "\\frac{3}{7}")
# (gold, answer): pairs the exact path cannot decide, so the worker does (the last is
# not equal at the default float rounding: a rejection costs a worker call too).
WORKER_PAIRS: tuple[tuple[str, str], ...] = (
    ("50\\%", "0.5"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\pi", "3.1416"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=50, help="oracle episodes per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the episode series")
    parser.add_argument("--calls", type=int, default=200, help="exact-path comparisons timed")
    parser.add_argument(
        "--verify-calls", type=int, default=20, help="math-verify comparisons timed per pair"
    )
    parser.add_argument("--format", default="inline", choices=["inline", "chat"])
    parser.add_argument("--prestart", type=int, default=0, help="sandboxes kept warm (PythonTool)")
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def _env_series(
    episodes: int, repeats: int, observation_format: str, prestart: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    from vt_envs.core.policy import run_episode
    from vt_envs.domains.math import MathOracle, make_math_env

    env = make_math_env(split="test", observation_format=observation_format, prestart=prestart)
    try:
        run_episode(env, MathOracle(), seed=0)  # warm-up: sandbox, tokenizer caches
        rates, rewards, latencies, steps_per_episode = [], [], [], []
        for r in range(repeats):
            steps = 0
            start = time.perf_counter()
            for e in range(episodes):
                result = run_episode(env, MathOracle(), seed=1000 * r + e + 1)
                steps += len(result.actions)
                steps_per_episode.append(len(result.actions))
                rewards.append(result.reward)
                latencies += [i["tool"]["latency_s"] for i in result.infos if "tool" in i]
            rates.append(steps / (time.perf_counter() - start))
    finally:
        env.close()
    mean_steps = statistics.fmean(steps_per_episode)
    env_report = {
        "steps_per_s_median": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "episodes_per_s_median": statistics.median(rates) / mean_steps,
        "steps_per_episode_mean": mean_steps,
        "episodes_per_repeat": episodes,
        "repeats": repeats,
        "mean_reward": statistics.fmean(rewards),
        "observation_format": observation_format,
        "prestart": prestart,
    }
    python_report = {
        "n": len(latencies),
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p90_ms": percentile(latencies, 0.9) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
    }
    return env_report, python_report


def _timed(fn: Any, *args: Any, n: int) -> tuple[list[float], Any]:
    samples, result = [], None
    for _ in range(n):
        start = time.perf_counter()
        result = fn(*args)
        samples.append(time.perf_counter() - start)
    return samples, result


def _verifier(calls: int, verify_calls: int) -> dict[str, Any]:
    from vt_envs.domains.math.verifier import _WORKER, MathVerifier, shutdown_worker

    verifier = MathVerifier()
    exact, (exact_equal, exact_path) = _timed(verifier.compare, *EXACT_PAIR, n=calls)
    shutdown_worker()  # so the first worker call below includes the start-up
    starts_before = _WORKER.starts
    cold, _ = _timed(verifier.compare, *WORKER_PAIRS[0], n=1)
    pairs = []
    for gold, answer in WORKER_PAIRS:
        samples, (equal, path) = _timed(verifier.compare, gold, answer, n=verify_calls)
        pairs.append(
            {
                "gold": gold,
                "answer": answer,
                "equal": equal,
                "path": path,
                "n": verify_calls,
                "p50_ms": percentile(samples, 0.5) * 1e3,
            }
        )
    exact_p50_ms = percentile(exact, 0.5) * 1e3
    worker_p50_ms = statistics.median(p["p50_ms"] for p in pairs)
    return {
        "exact": {
            "gold": EXACT_PAIR[0],
            "answer": EXACT_PAIR[1],
            "equal": exact_equal,
            "path": exact_path,
            "n": calls,
            "p50_us": exact_p50_ms * 1e3,
        },
        "math_verify": pairs,
        "math_verify_first_call_incl_worker_start_s": cold[0],
        "worker_starts": _WORKER.starts - starts_before,
        "worker_vs_exact_p50": worker_p50_ms / exact_p50_ms,
    }


def run_benchmark(
    episodes: int,
    repeats: int,
    calls: int,
    verify_calls: int,
    observation_format: str = "inline",
    prestart: int = 0,
) -> dict[str, Any]:
    """Run every series; returns the JSON-ready report."""
    env, python = _env_series(episodes, repeats, observation_format, prestart)
    return {
        "env": env,
        "python": python,
        "verifier": _verifier(calls, verify_calls),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def render(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    env, py, ver = report["env"], report["python"], report["verifier"]
    rows = [
        f"Oracle on VT-Math-v0 (test split, {env['observation_format']} observations, "
        f"prestart {env['prestart']}): **{env['steps_per_s_median']:.1f} steps/s** median "
        f"(min {env['steps_per_s_min']:.1f}, max {env['steps_per_s_max']:.1f}; "
        f"{env['episodes_per_s_median']:.1f} episodes/s; {env['repeats']} x "
        f"{env['episodes_per_repeat']} episodes, resets included; mean reward "
        f"{env['mean_reward']:.2f}).",
        "",
        "| latency | n | p50 (ms) | p90 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|---:|",
        f"| python tool call | {py['n']} | {py['p50_ms']:.2f} | {py['p90_ms']:.2f} "
        f"| {py['p99_ms']:.2f} |",
        "",
        "| verifier comparison | path | n | p50 (ms) | x exact |",
        "|---|---|---:|---:|---:|",
    ]
    exact_ms = ver["exact"]["p50_us"] / 1e3
    rows.append(
        f"| `{ver['exact']['gold']}` vs `{ver['exact']['answer']}` | {ver['exact']['path']} "
        f"| {ver['exact']['n']} "
        f"| {exact_ms:.3f} | 1 |"
    )
    for p in ver["math_verify"]:
        rows.append(
            f"| `{p['gold']}` vs `{p['answer']}` | {p['path']} | {p['n']} | {p['p50_ms']:.2f} "
            f"| {p['p50_ms'] / exact_ms:.0f} |"
        )
    rows += [
        "",
        f"The exact path is **{ver['worker_vs_exact_p50']:.0f}x** cheaper than a math-verify "
        f"worker call (median over the pairs); the worker's first call, start-up included, "
        f"took {ver['math_verify_first_call_incl_worker_start_s']:.2f} s.",
    ]
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(
        args.episodes, args.repeats, args.calls, args.verify_calls, args.format, args.prestart
    )
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "math_speed.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0
