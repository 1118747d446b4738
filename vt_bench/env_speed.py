"""Env speed: every registered env id, played by its oracle through ``gym.make``.

For each id (one after another, in one process, after one warm-up episode):
``--episodes`` oracle episodes on the test split, resets included, stopping
early once ``--seconds`` have passed (at least three episodes are played):
episodes/s, steps/s, the reset's and the step's p50 / p99, and the tool
calls' latency p50 / p99 as the env reports it (``info["tool"]["latency_s"]``:
the call itself, sandbox and deadline machinery included), and the mean
reward (1.0: the oracle solves every task, so the work is the real one).

Then the env's own overhead: VT-Lookup-v0 (its 500-task test split) through
``gym.make``, a reset and an answer (no tool call), microseconds per
episode, the median of 5 repeats of ``--overhead-episodes`` episodes, after
a warm-up that has generated the tasks (drawing a task, rendering and
tokenizing its prompt, parsing, verification, the sync facade: all
included); and, apart, what generating a task the first time costs.

Prints Markdown and writes ``env_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from vt_bench.stats import latency_summary

__all__ = ["add_arguments", "main", "measure_env", "render", "run_benchmark"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env-ids", nargs="+", default=None, help="default: every registered id")
    parser.add_argument("--episodes", type=int, default=30, help="oracle episodes per env id")
    parser.add_argument("--seconds", type=float, default=20.0, help="time budget per env id")
    parser.add_argument(
        "--overhead-episodes", type=int, default=1000, help="answer-only episodes per repeat"
    )
    parser.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for JSON")


def measure_env(env_id: str, episodes: int, seconds: float) -> dict[str, Any]:
    """Play ``env_id``'s oracle through ``gym.make`` and time it (see the module docstring)."""
    import gymnasium as gym

    import vt_envs

    start = time.perf_counter()
    env = gym.make(env_id, split="test")
    make_s = time.perf_counter() - start
    resets, steps, calls, rewards = [], [], [], []
    played = 0
    try:
        tasks = env.unwrapped.tasks
        _episode(env, vt_envs.oracle_for(env_id), tasks[0].id, [], [], [], [])  # warm-up
        start = time.perf_counter()
        while played < episodes and (played < 3 or time.perf_counter() - start < seconds):
            task_id = tasks[played % len(tasks)].id
            _episode(env, vt_envs.oracle_for(env_id), task_id, resets, steps, calls, rewards)
            played += 1
        wall = time.perf_counter() - start
    finally:
        env.close()
    return {
        "episodes": played,
        "episodes_per_s": played / wall,
        "steps_per_s": len(steps) / wall,
        "mean_reward": sum(rewards) / max(len(rewards), 1),
        "make_s": make_s,
        "reset": latency_summary(resets),
        "step": latency_summary(steps),
        "tool_call": latency_summary(calls) if calls else None,
    }


def _episode(env, oracle, task_id, resets, steps, calls, rewards) -> None:
    t0 = time.perf_counter()
    obs, info = env.reset(options={"task_id": task_id})
    resets.append(time.perf_counter() - t0)
    oracle.reset(env.unwrapped.task)
    while True:
        action = oracle.act(obs["text"], info)
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append(time.perf_counter() - t0)
        for call in info.get("tools") or ([info["tool"]] if "tool" in info else []):
            calls.append(float(call["latency_s"]))
        if terminated or truncated:
            rewards.append(float(reward))
            return


def measure_overhead(episodes: int, repeats: int = 5) -> dict[str, Any]:
    """Microseconds per VT-Lookup-v0 episode of a reset and a correct answer, and
    per first generation of a task."""
    import statistics

    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)
    from vt_envs.domains.lookup import lookup_tasks

    env = gym.make("VT-Lookup-v0", split="test")
    try:
        env.reset(seed=0)
        for _ in range(3000):  # warm-up: all but a few of the 500 tasks generated
            env.reset()
            env.step("<answer>0</answer>")
        per_episode = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(episodes):
                env.reset()
                env.step(f"<answer>{env.unwrapped.task.gold}</answer>")
            per_episode.append((time.perf_counter() - start) / episodes * 1e6)
    finally:
        env.close()
    fresh = lookup_tasks("train")
    start = time.perf_counter()
    for index in range(1000):
        fresh[index]
    generate_us = (time.perf_counter() - start) / 1000 * 1e6
    return {"us_per_episode": statistics.median(per_episode), "repeats": per_episode,
            "episodes": episodes, "first_generation_us": generate_us}  # fmt: skip


def run_benchmark(
    env_ids: list[str] | None, episodes: int, seconds: float, overhead_episodes: int = 1000
) -> dict[str, Any]:
    import vt_envs

    ids = env_ids or list(vt_envs.registered_envs())
    envs = {env_id: measure_env(env_id, episodes, seconds) for env_id in ids}
    return {"envs": envs, "overhead": measure_overhead(overhead_episodes)}


def render(report: dict[str, Any]) -> str:
    rows = [
        "| env id (oracle) | episodes/s | steps/s | reset p50 / p99 (ms) | step p50 / p99 (ms) "
        "| tool call p50 / p99 (ms) | reward | episodes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for env_id, m in report["envs"].items():
        tool = m["tool_call"]
        tool_text = f"{tool['p50_ms']:.2f} / {tool['p99_ms']:.2f}" if tool else "-"
        rows.append(
            f"| {env_id} | {m['episodes_per_s']:.1f} | {m['steps_per_s']:.1f} | "
            f"{m['reset']['p50_ms']:.2f} / {m['reset']['p99_ms']:.2f} | "
            f"{m['step']['p50_ms']:.2f} / {m['step']['p99_ms']:.2f} | {tool_text} | "
            f"{m['mean_reward']:.2f} | {m['episodes']} |"
        )
    overhead = report.get("overhead")
    if overhead:
        rows += ["", f"Env overhead (VT-Lookup-v0 through `gym.make`, a reset and an answer, no "
                 f"tool): **{overhead['us_per_episode']:.0f} µs an episode** (median of "
                 f"{len(overhead['repeats'])} x {overhead['episodes']:,} episodes, its tasks "
                 f"generated; generating a task the first time adds "
                 f"{overhead['first_generation_us']:.0f} µs)."]  # fmt: skip
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(args.env_ids, args.episodes, args.seconds, args.overhead_episodes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "env_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0
