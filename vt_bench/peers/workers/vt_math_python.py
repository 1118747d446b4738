"""VT side of the one-call episode comparison: VT-Math-v0, reset, one sandboxed
``<python>`` call that prints the answer, then the answer."""

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
        _, _, _, _, info = env.step(f"<python>print({problem['answer']!r})</python>")
        assert problem["answer"] in info["message"]["content"], info["message"]
        _, reward, *_ = env.step(f"The answer is \\boxed{{{problem['answer']}}}.")
        reward_sum += reward
    return n, reward_sum


if __name__ == "__main__":
    serve(setup, run)
