"""Smoke test of ``python -m vt_bench visual-speed`` (tiny counts, no timing claims)."""

from __future__ import annotations

import json

from vt_bench.__main__ import main


def test_visual_speed_runs_and_writes_json(tmp_path, capsys):
    argv = ["--episodes", "2", "--repeats", "2", "--max-pixels", str(256 * 28 * 28)]
    assert main(["visual-speed", *argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "visual_speed.json").read_text())
    placeholder, processor = report["placeholder"], report["processor"]
    for series in (placeholder, processor):
        assert series["mean_reward"] == 1.0  # the oracle zooms, then answers right
        assert series["reset"]["n"] == 4 and series["zoom"]["n"] == 4
    assert placeholder["image_tokens_per_episode"] == 2.0  # the scene and the zoom: one id each
    assert processor["image_tokens_per_episode"] > 200  # the processor's expansion
    assert "| Qwen2-VL processor |" in capsys.readouterr().out
