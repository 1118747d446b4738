"""Smoke test of ``python -m vt_bench swe-speed`` (tiny counts, no timing claims)."""

from __future__ import annotations

import json

from vt_bench.__main__ import main


def test_swe_speed_runs_and_writes_json(tmp_path, capsys):
    argv = ["--episodes", "2", "--max-tasks", "8"]
    assert main(["swe-speed", *argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "swe_speed.json").read_text())
    build, episodes = report["build"], report["episodes"]
    assert build["tasks"] == build["train"] + build["test"] and build["test"] >= 1
    assert build["cached_s"] < build["build_s"]  # the second call reads the cache
    assert episodes["mean_reward"] == 1.0 and episodes["reset"]["n"] == 2
    assert episodes["workspace"]["n"] >= 2 and episodes["evaluation"]["n"] == 2
    assert "| hidden-test evaluation |" in capsys.readouterr().out
