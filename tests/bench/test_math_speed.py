"""Smoke test of ``python -m vt_bench math-speed`` (tiny counts, no timing claims)."""

from __future__ import annotations

import json

from vt_bench.__main__ import main
from vt_bench.math_speed import WORKER_PAIRS


def test_math_speed_runs_and_writes_json(tmp_path, capsys):
    argv = ["--episodes", "2", "--repeats", "2", "--calls", "3", "--verify-calls", "2"]
    assert main(["math-speed", *argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "math_speed.json").read_text())
    env = report["env"]
    assert env["repeats"] == 2 and env["episodes_per_repeat"] == 2
    assert env["mean_reward"] == 1.0  # the oracle solves every episode
    assert env["steps_per_episode_mean"] == 2.0  # one python call, then the answer
    assert report["python"]["n"] == 4  # one tool call per measured episode
    verifier = report["verifier"]
    assert (verifier["exact"]["path"], verifier["exact"]["equal"]) == ("exact", True)
    assert verifier["exact"]["n"] == 3
    # Every worker pair is decided by math-verify, not the exact path; pi is not 3.1416.
    pairs = verifier["math_verify"]
    assert [(p["gold"], p["answer"]) for p in pairs] == list(WORKER_PAIRS)
    assert [p["path"] for p in pairs] == ["math-verify"] * 4
    assert [p["equal"] for p in pairs] == [True, True, True, False]
    assert verifier["worker_starts"] == 1  # restarted once for the cold call, then reused
    out = capsys.readouterr().out
    assert "| python tool call | 4 |" in out and "| math-verify |" in out
