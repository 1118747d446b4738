"""Benchmark VT-Math-v0: env steps/s with the oracle, and the verifier's two paths.

Usage::

    python scripts/bench_math.py [--episodes 50] [--repeats 5] [--format inline|chat]
                                 [--prestart 0]

Prints one JSON object: steps/s (median over repeats, each repeat running
``--episodes`` oracle episodes on one env, resets included; a step is one
``env.step``),
python tool latency percentiles, and the verifier's cost per comparison on
the exact path and through the math-verify worker (plus its start-up time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import vt_envs
from vt_envs.domains.math import MathOracle, make_math_env
from vt_envs.domains.math.verifier import _WORKER, MathVerifier, shutdown_worker


def bench_env(episodes: int, repeats: int, observation_format: str, prestart: int) -> dict:
    env = make_math_env(split="test", observation_format=observation_format, prestart=prestart)
    vt_envs.run_episode(env, MathOracle(), seed=0)  # warm: sandbox, tokenizer caches
    rates, latencies = [], []
    for r in range(repeats):
        steps, start = 0, time.perf_counter()
        for e in range(episodes):
            run = vt_envs.run_episode(env, MathOracle(), seed=1000 * r + e)
            assert run.reward == 1.0, run.task_id
            steps += len(run.actions)
            latencies += [i["tool"]["latency_s"] for i in run.infos if "tool" in i]
        rates.append(steps / (time.perf_counter() - start))
    env.close()
    lat_ms = np.percentile(np.array(latencies) * 1e3, [50, 90, 99])
    return {
        "steps_per_s_median": round(statistics.median(rates), 1),
        "steps_per_s_all": [round(x, 1) for x in rates],
        "episodes_per_s_median": round(statistics.median(rates) / 2, 1),
        "python_latency_ms_p50_p90_p99": [round(float(x), 2) for x in lat_ms],
    }


def bench_verifier(n: int = 200) -> dict:
    verifier = MathVerifier()
    start = time.perf_counter()
    for _ in range(n):
        verifier.compare("3/7", "\\frac{3}{7}")
    exact_us = (time.perf_counter() - start) / n * 1e6
    shutdown_worker()
    start = time.perf_counter()
    verifier.compare("50\\%", "0.5")
    cold_s = time.perf_counter() - start
    pairs = [
        ("50\\%", "0.5"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("\\pi", "3.1416"),
    ]
    per_pair = {}
    for gold, answer in pairs:
        start = time.perf_counter()
        for _ in range(20):
            verifier.compare(gold, answer)
        per_pair[f"{gold} vs {answer}"] = round((time.perf_counter() - start) / 20 * 1e3, 2)
    return {
        "exact_path_us": round(exact_us, 1),
        "math_verify_first_call_incl_worker_start_s": round(cold_s, 2),
        "math_verify_ms": per_pair,
        "worker_starts": _WORKER.starts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--format", default="inline", choices=["inline", "chat"])
    parser.add_argument("--prestart", type=int, default=0, help="sandboxes kept warm (PythonTool)")
    args = parser.parse_args()
    report = {
        "env": "VT-Math-v0",
        "observation_format": args.format,
        "prestart": args.prestart,
        **bench_env(args.episodes, args.repeats, args.format, args.prestart),
        "verifier": bench_verifier(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
