"""Percentiles and latency summaries shared by the benchmarks."""

from __future__ import annotations

__all__ = ["latency_summary", "percentile"]


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``samples`` (``q`` in [0, 1])."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_summary(samples: list[float]) -> dict[str, float]:
    """``n``, ``p50_ms`` and ``p99_ms`` of latencies given in seconds."""
    return {
        "n": len(samples),
        "p50_ms": percentile(samples, 0.5) * 1e3,
        "p99_ms": percentile(samples, 0.99) * 1e3,
    }
