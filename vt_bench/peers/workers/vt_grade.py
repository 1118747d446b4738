"""VT side of the math-grading comparison: VT-Math-v0's verifier on answer pairs."""

from __future__ import annotations

from _loop import serve


def setup(params):
    from vt_envs.domains.math.verifier import MathVerifier

    return MathVerifier(), [tuple(p) for p in params["pairs"]]


def run(state, n):
    verifier, pairs = state
    correct = 0
    for i in range(n):
        answer, gold = pairs[i % len(pairs)]
        correct += verifier.equivalent(gold, answer)
    return n, correct


if __name__ == "__main__":
    serve(setup, run)
