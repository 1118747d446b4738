"""SWE speed: VT-SWE-v0's task build, working copies, resets, evaluations and oracle episodes.

Measured in one run:

- ``build``: building the mutant tasks of a repository (default: the built-in
  ``vtutils``) into a fresh, temporary task cache: how many candidates were
  kept, and the wall time; then the same call again (from the cache);
- ``episodes``: ``--episodes`` oracle episodes on the test split (view,
  revert, run the visible tests, submit), resets included: episodes/s, and
  p50/p99 of the working copy's creation, of ``env.reset`` and of the hidden-
  test evaluation after ``<submit>`` (``info["verifier_parts"]["eval_s"]``).

Prints Markdown and writes ``swe_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from vt_bench.stats import latency_summary

__all__ = ["add_arguments", "main", "render", "run_benchmark"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=10, help="oracle episodes")
    parser.add_argument("--max-tasks", type=int, default=60, help="mutants validated at most")
    parser.add_argument("--repo", default=None, help="repository to build from (default vtutils)")
    parser.add_argument("--source-dir", default=None, help="its package directory (inferred)")
    parser.add_argument("--test-dir", default="tests", help="its tests directory")
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def run_benchmark(
    episodes: int,
    max_tasks: int,
    repo: str | None,
    source_dir: str | None = None,
    test_dir: str = "tests",
) -> dict[str, Any]:
    import vt_envs  # noqa: F401  (registers the ids)
    from vt_envs.domains.swe.env import make_swe_env
    from vt_envs.domains.swe.oracle import SWEOracle
    from vt_envs.domains.swe.sources import repository_tasks

    with tempfile.TemporaryDirectory(prefix="vt-swe-bench-") as cache:
        start = time.perf_counter()
        where = {"repo": repo, "source_dir": source_dir, "test_dir": test_dir}
        train = repository_tasks("train", **where, max_tasks=max_tasks, cache=cache)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        test = repository_tasks("test", **where, max_tasks=max_tasks, cache=cache)
        cached_s = time.perf_counter() - start
        env = make_swe_env(tasks=test)
        store = env.tools["bash"].store
        resets, evals, rewards = [], [], []
        start = time.perf_counter()
        try:
            for e in range(episodes):
                task = test[e % len(test)]
                t0 = time.perf_counter()
                obs, info = env.reset(options={"task_id": task.id})
                resets.append(time.perf_counter() - t0)
                oracle = SWEOracle()
                oracle.reset(task)
                done = False
                while not done:
                    obs, reward, terminated, truncated, info = env.step(
                        oracle.act(obs["text"], info)
                    )
                    done = terminated or truncated
                rewards.append(reward)
                evals.append(info["verifier_parts"]["eval_s"])
        finally:
            env.close()
        wall = time.perf_counter() - start
    return {
        "build": {
            "repo": repo or "vtutils (built-in)",
            "tasks": len(train) + len(test),
            "train": len(train),
            "test": len(test),
            "build_s": build_s,
            "cached_s": cached_s,
        },
        "episodes": {
            "n": episodes,
            "episodes_per_s": episodes / wall,
            "mean_reward": sum(rewards) / max(len(rewards), 1),
            "workspace": latency_summary(store.creation_s),
            "reset": latency_summary(resets),
            "evaluation": latency_summary(evals),
        },
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def render(report: dict[str, Any]) -> str:
    b, e = report["build"], report["episodes"]
    rows = [
        f"Task build ({b['repo']}): **{b['tasks']} tasks** ({b['train']} train / {b['test']} "
        f"test) in {b['build_s']:.1f} s; from the cache {b['cached_s'] * 1e3:.0f} ms.",
        "",
        f"Oracle on the test split: **{e['episodes_per_s']:.2f} episodes/s** ({e['n']} episodes, "
        f"mean reward {e['mean_reward']:.2f}).",
        "",
        "| step | n | p50 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|",
    ]
    for label, key in (
        ("working copy creation", "workspace"),
        ("env.reset (copy + bash sandbox start)", "reset"),
        ("hidden-test evaluation", "evaluation"),
    ):
        s = e[key]
        rows.append(f"| {label} | {s['n']} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} |")
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(args.episodes, args.max_tasks, args.repo, args.source_dir, args.test_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "swe_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0
