"""Smoke test of ``python -m vt_bench sandbox-speed`` (tiny repeat counts, no timing claims)."""

from __future__ import annotations

import json

from vt_bench.__main__ import main


def test_sandbox_speed_runs_and_writes_json(tmp_path, capsys):
    assert main(["sandbox-speed", "--repeats", "3", "--startups", "2", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "sandbox_speed.json").read_text())
    assert set(report["series"]) == {
        "persistent",
        "fresh_subprocess",
        "startup_cold",
        "startup_prestarted",
        "bash",
    }
    assert report["series"]["persistent"]["n"] == 3 and report["series"]["startup_cold"]["n"] == 2
    assert report["isolation"]["backend"] == "bwrap"
    assert "| persistent |" in capsys.readouterr().out
