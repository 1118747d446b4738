"""pass@k, intervals and the torn-line-safe record file, against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest

from vt_bench.evals.metrics import (
    bootstrap_mean_ci,
    pass_at_k,
    pass_at_k_curve,
    summarize_env,
    wilson_interval,
)
from vt_bench.evals.records import RecordFile


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 2, 4, 1.0),  # n - c < k: every draw holds a correct one
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 100/200
        (1000, 3, 500, 1 - math.comb(997, 500) / math.comb(1000, 500)),  # huge binomials
    ],
)
def test_pass_at_k_matches_the_binomial_definition(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_the_pass_at_k_curve_averages_tasks_up_to_the_fewest_samples():
    curve = pass_at_k_curve({"a": [True, False, False, False], "b": [False] * 4, "c": [True] * 3})
    assert list(curve) == [1, 2, 3]
    assert curve[1] == pytest.approx((0.25 + 0 + 1) / 3)
    assert curve[2] == pytest.approx((0.5 + 0 + 1) / 3)  # a: 1 - C(3,2)/C(4,2) = 0.5


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 3.8415 / 13.8415), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((10 / 13.8415, 1.0), abs=1e-4)
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    values = [0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.25, 1.0]
    low, high = bootstrap_mean_ci(values)
    assert low < sum(values) / len(values) < high
    assert bootstrap_mean_ci(values) == (low, high)
    assert bootstrap_mean_ci([0.7]) == (0.7, 0.7) and bootstrap_mean_ci([]) == (0.0, 0.0)


def _record(task, sample, correct, **extra):
    return {
        "env_id": "E", "task_id": task, "sample": sample, "reward": float(correct),
        "correct": correct, "turns": [{"tokens_in": 10, "tokens_out": 3}] * 2,
        "tool_calls": [{"name": "t", "ok": sample == 0, "error": None if sample == 0 else "x",
                        "latency_s": 0.01}],
        "invalid_actions": 1, "truncated": False, "truncation": None, "elapsed_s": 0.1,
        **extra,
    }  # fmt: skip


def test_the_summary_does_not_depend_on_the_order_rollouts_finished_in():
    records = [_record(t, s, (t == "a") or s == 1) for t in "abc" for s in range(2)]
    forward, backward = summarize_env(records), summarize_env(records[::-1])
    assert forward == backward
    assert forward["accuracy"] == pytest.approx(4 / 6)
    assert forward["pass_at_k"] == {"1": pytest.approx(4 / 6), "2": 1.0}
    assert forward["tool_error_rate"] == pytest.approx(0.5)
    assert forward["invalid_action_rate"] == pytest.approx(6 / 12)
    assert forward["mean_tokens_in"] == 20 and forward["mean_tokens_out"] == 6


def test_a_torn_last_line_is_dropped_and_the_next_append_starts_clean(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    complete = json.dumps({"env_id": "E", "task_id": "a", "sample": 0}) + "\n"
    path.write_text(complete + '{"env_id": "E", "task_id": "b", "sam')  # killed mid-write
    store = RecordFile(path)
    assert [r["task_id"] for r in store.read()] == ["a"]
    store.append({"env_id": "E", "task_id": "b", "sample": 0})
    store.close()
    assert [r["task_id"] for r in RecordFile(path).read()] == ["a", "b"]
    assert path.read_text().count("\n") == 2
