"""Smoke test of ``python -m vt_bench trainer-speed`` (tiny model and batch, no timing claims)."""

from __future__ import annotations

import json

from vt_bench.__main__ import main

TINY = [
    *("--steps", "1", "--hidden-size", "16", "--layers", "1"),
    *("--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "16"),
]


def test_trainer_speed_runs_and_writes_json(tmp_path, capsys):
    assert main(["trainer-speed", *TINY, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "trainer_speed.json").read_text())
    assert set(report["update"]) == {"grpo", "ppo"}
    for algo, update in report["update"].items():
        assert len(update["train_tokens_per_s_all"]) == 1, algo  # --steps 1, warm-up excluded
        assert update["tokens_per_step_mean"] > 0
        # The scripted policy: half of each group looks the key up and answers right
        # (its actions fit in 16 tokens).
        assert update["mean_reward"] == 0.5, algo
    rollout = report["rollout_hf"]
    # A random model's junk actions run every episode to max_turns (4), each turn at
    # most max_new_tokens long.
    assert rollout["mean_turns"] == 4.0
    assert 2 * 2 * 4 <= rollout["generated_tokens_per_step_mean"] <= 2 * 2 * 4 * 16
    assert report["config"]["hidden_size"] == 16 and report["machine"]["torch"]
    out = capsys.readouterr().out
    assert "| grpo update |" in out and "| ppo update |" in out and "| hf rollout" in out
