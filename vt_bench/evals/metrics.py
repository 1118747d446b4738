"""Evaluation statistics: unbiased pass@k, confidence intervals, per-env summaries.

Everything here is pure and deterministic (the bootstrap is seeded), so a
resumed evaluation's ``summary.json`` equals an uninterrupted one's.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from vt_bench.stats import percentile

__all__ = [
    "bootstrap_mean_ci",
    "pass_at_k",
    "pass_at_k_curve",
    "summarize_env",
    "summarize_kinds",
    "wilson_interval",
]

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct:
    ``1 - C(n-c, k) / C(n, k)``, computed as a product so it never overflows
    (``1 - prod_{i=n-c+1..n} (1 - k/i)``).

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_curve(correct_per_task: Mapping[str, Sequence[bool]]) -> dict[int, float]:
    """Mean pass@k over tasks for every ``k`` up to the fewest samples any task has."""
    if not correct_per_task:
        return {}
    most = min(len(v) for v in correct_per_task.values())
    return {
        k: statistics.fmean(pass_at_k(len(v), sum(v), k) for v in correct_per_task.values())
        for k in range(1, most + 1)
    }


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); ``(0, 1)`` when ``n == 0``."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_ci(
    values: Sequence[float], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """A percentile-bootstrap interval of the mean (seeded: the same values give the same
    interval); a single value gives ``(v, v)``, none ``(0, 0)``."""
    if not values:
        return 0.0, 0.0
    data = np.asarray(values, dtype=np.float64)
    if len(data) == 1 or np.all(data == data[0]):
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def summarize_env(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The metrics of one env's rollout records (see :mod:`vt_bench.evals.records`).

    Records are read in ``(task_id, sample)`` order, so the result does not depend on
    the order rollouts finished in. Rollouts that raised (``error`` set) count as
    reward 0 and are reported in ``errors`` (the runner scores only env ids without
    any). ``kinds``: :func:`summarize_kinds`.
    """
    rows = sorted(records, key=lambda r: (r["task_id"], r["sample"]))
    n = len(rows)
    rewards = [float(r["reward"]) for r in rows]
    correct = [bool(r["correct"]) for r in rows]
    per_task: dict[str, list[bool]] = defaultdict(list)
    for r, ok in zip(rows, correct):
        per_task[r["task_id"]].append(ok)
    calls = [c for r in rows for c in r["tool_calls"]]
    latencies = [float(c["latency_s"]) for c in calls]
    turns = [len(r["turns"]) for r in rows]
    tokens_in = [sum(t["tokens_in"] for t in r["turns"]) for r in rows]
    tokens_out = [sum(t["tokens_out"] for t in r["turns"]) for r in rows]
    invalid = sum(int(r.get("invalid_actions", 0)) for r in rows)
    tool_names = Counter(c["name"] for c in calls)
    return {
        "episodes": n,
        "tasks": len(per_task),
        "mean_reward": statistics.fmean(rewards) if rows else 0.0,
        "mean_reward_ci95": list(bootstrap_mean_ci(rewards)),
        "accuracy": sum(correct) / n if n else 0.0,
        "accuracy_ci95": list(wilson_interval(sum(correct), n)),
        "pass_at_k": {str(k): v for k, v in pass_at_k_curve(per_task).items()},
        "mean_turns": statistics.fmean(turns) if rows else 0.0,
        "turns_histogram": {str(k): v for k, v in sorted(Counter(turns).items())},
        "tool_calls_per_episode": len(calls) / n if n else 0.0,
        "tool_usage": dict(sorted(tool_names.items())),
        "invalid_action_rate": invalid / max(sum(turns), 1),
        "tool_error_rate": sum(not c["ok"] for c in calls) / max(len(calls), 1),
        "tool_errors": dict(sorted(Counter(c["error"] for c in calls if not c["ok"]).items())),
        "mean_tokens_in": statistics.fmean(tokens_in) if rows else 0.0,
        "mean_tokens_out": statistics.fmean(tokens_out) if rows else 0.0,
        "truncations": dict(
            sorted(Counter(r["truncation"] or "none" for r in rows if r["truncated"]).items())
        ),
        "errors": sum(r.get("error") is not None for r in rows),
        "kinds": summarize_kinds(rows),
        # Wall-clock figures: they differ between runs, unlike everything above.
        "timing": {
            "tool_latency_p50_ms": percentile(latencies, 0.5) * 1e3 if latencies else 0.0,
            "tool_latency_p99_ms": percentile(latencies, 0.99) * 1e3 if latencies else 0.0,
            "mean_episode_s": statistics.fmean(float(r["elapsed_s"]) for r in rows)
            if rows
            else 0.0,
        },
    }


def summarize_kinds(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Reward and accuracy per task kind (a record's ``kind``: the task's family or kind,
    see :func:`vt_bench.evals.runner.task_kind`), kinds sorted; ``{}`` when no record
    names one. Records without a kind are grouped under ``"(none)"``."""
    rows = list(records)
    if not any(r.get("kind") is not None for r in rows):
        return {}
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[str(r["kind"]) if r.get("kind") is not None else "(none)"].append(r)
    out = {}
    for kind in sorted(groups):
        group = groups[kind]
        rewards = [float(r["reward"]) for r in group]
        correct = sum(bool(r["correct"]) for r in group)
        out[kind] = {
            "episodes": len(group),
            "tasks": len({r["task_id"] for r in group}),
            "mean_reward": statistics.fmean(rewards),
            "accuracy": correct / len(group),
            "accuracy_ci95": list(wilson_interval(correct, len(group))),
        }
    return out
