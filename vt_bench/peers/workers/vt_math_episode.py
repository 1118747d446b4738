"""VT side of the answer-only episode comparison: VT-Math-v0, reset then the answer."""

from __future__ import annotations

from _loop import serve
from _vt_math import math_env


def setup(params):
    return math_env(params)


def run(state, n):
    env, problems = state
    reward_sum = 0.0
    for i in range(n):
        problem = problems[i % len(problems)]
        env.reset(options={"task_id": problem["id"]})
        _, reward, *_ = env.step(f"The answer is \\boxed{{{problem['answer']}}}.")
        reward_sum += reward
    return n, reward_sum


if __name__ == "__main__":
    serve(setup, run)
