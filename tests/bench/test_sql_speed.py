"""Smoke test of the SQL speed benchmark (tiny counts, no timing claims)."""

from __future__ import annotations

import argparse
import json

from vt_bench import sql_speed


def test_sql_speed_runs_and_writes_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    parser = argparse.ArgumentParser()
    sql_speed.add_arguments(parser)
    args = parser.parse_args(
        ["--episodes", "3", "--repeats", "2", "--calls", "3", "--out", str(tmp_path / "out")]
    )
    assert sql_speed.main(args) == 0
    report = json.loads((tmp_path / "out" / "sql_speed.json").read_text())
    assert set(report["databases"]) == {"flights", "tpch", "shop"}
    assert report["databases"]["tpch"]["tables"]["region"] == 5
    assert report["env"]["mean_reward"] == 1.0 and report["env"]["repeats"] == 2
    assert report["latency"]["tool_call"]["n"] == 3
    assert "| flights |" in capsys.readouterr().out
