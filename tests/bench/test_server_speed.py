"""Smoke test of ``python -m vt_bench server-speed`` (tiny counts, no timing claims)."""

from __future__ import annotations

import json

from vt_bench.__main__ import main


def test_server_speed_runs_and_writes_json(tmp_path, capsys):
    argv = ["--steps", "6", "--calls", "16", "--inflight", "1", "8", "--workers", "1"]
    assert main(["server-speed", *argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "server_speed.json").read_text())
    for tool in ("lookup", "python"):
        m = report["overhead"][tool]
        assert m["local"]["n"] == m["remote"]["n"] == 6
    assert [t["inflight"] for t in report["throughput"]] == [1, 8]
    assert all(t["failures"] == 0 and t["calls"] == 16 for t in report["throughput"])
    ray = report["ray_vs_local"]
    assert ray is None or (ray["local_steps_per_s"] > 0 and ray["ray_steps_per_s"] > 0)
    assert "| python |" in capsys.readouterr().out
