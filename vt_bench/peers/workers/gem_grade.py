"""GEM side of the math-grading comparison: MathEnv's grader on the same pairs."""

from __future__ import annotations

from _loop import serve


def setup(params):
    from gem.envs.math_env import MathEnv

    return MathEnv.check_correct, [tuple(p) for p in params["pairs"]]


def run(state, n):
    check, pairs = state
    correct = 0
    for i in range(n):
        answer, gold = pairs[i % len(pairs)]
        correct += bool(check(answer, gold))
    return n, correct


if __name__ == "__main__":
    serve(setup, run)
