"""``python -m vt_bench rollout-scale`` at tiny sizes (no timing claims): the oracle
script plays every trajectory to its reward, the replayed critical path is the
trajectory it names, the bound never exceeds the wall time, and a level that
would not fit in memory is skipped rather than run."""

from __future__ import annotations

import json

from vt_bench import rollout_scale
from vt_bench.__main__ import main

TINY = ["--tick-ms", "0.5", "--per-seq-us", "5", "--think-tokens", "2", "6", "--replays", "1"]


def test_math_at_two_levels_in_process_and_behind_a_server(tmp_path, capsys):
    argv = ["rollout-scale", "--envs", "VT-Math-v0", "--concurrency", "4", "8",
            "--backends", "local", "server", "--server-workers", "1", *TINY,
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "rollout_scale.json").read_text())
    rows = report["rows"]
    assert [(r["backend"], r["concurrency"]) for r in rows] == [
        ("local", 4),
        ("local", 8),
        ("server", 4),
        ("server", 8),
    ]
    for r in rows:
        assert r["reward_mean"] == 1.0, r  # the oracle, fed each observation, solved them all
        assert r["tool_calls"] >= r["concurrency"]  # every episode ran its code
        bounds = r["bounds"]
        assert set(bounds) == {"critical_path_s", "engine_s", "thread_cpu_s",
                               "cpu_per_core_s"}  # fmt: skip
        assert r["binding"] == max(bounds, key=bounds.__getitem__)
        # No bound exceeds the wall time it bounds (replay noise aside).
        assert 0 < r["fraction_of_bound"] <= 1.25, r
        assert r["step"]["p50_ms"] <= r["step"]["p99_ms"] <= r["step"]["max_ms"]
        assert r["memory"]["host_rss_peak_mb"] > 0
    out = capsys.readouterr().out
    assert "| VT-Math-v0 | in process | 8 |" in out
    assert "| VT-Math-v0 | server, 1 workers | 4 |" in out


def test_a_level_that_would_not_fit_in_memory_is_skipped(tmp_path, monkeypatch):
    # After the first level, about 0 MB seem to be available: the next is skipped.
    levels = iter([10**6, 0.0])
    monkeypatch.setattr(rollout_scale, "available_mb", lambda: next(levels))
    argv = ["rollout-scale", "--envs", "VT-Math-v0", "--concurrency", "2", "4",
            "--backends", "local", *TINY, "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((tmp_path / "rollout_scale.json").read_text())["rows"]
    assert "skipped" not in rows[0] and rows[0]["concurrency"] == 2
    assert rows[1]["concurrency"] == 4 and "GB available" in rows[1]["skipped"]
    assert "skipped: needs about" in rollout_scale.render(
        json.loads((tmp_path / "rollout_scale.json").read_text())
    )


def test_the_script_knows_each_requests_trajectory_and_turn_from_its_seed():
    """Two trajectories of different tasks, requests interleaved: each gets its own
    task's oracle action, and a replay keyed like trajectory 1 thinks as it did."""
    import vt_envs
    from vt_train.engines.base import SamplingParams
    from vt_train.rollout import turn_seed

    env = vt_envs.make("VT-Math-v0", split="test")
    tasks = [env.tasks[3], env.tasks[7]]
    tok = env.tokenizer

    def script(seed, keys=None, which=tasks):
        return rollout_scale.OracleScript(
            lambda: vt_envs.oracle_for("VT-Math-v0"), which, tok, seed=seed, max_turns=4,
            think_tokens=(0, 5), think_keys=keys,
        )  # fmt: skip

    def oracle_action(task, observation):
        oracle = vt_envs.oracle_for("VT-Math-v0")
        oracle.reset(task)
        return oracle.act(observation, {})

    s = script(11)
    prompts = [env.reset(options={"task": t})[0]["tokens"].tolist() for t in tasks]
    second = s(prompts[1], SamplingParams(seed=turn_seed(11, 1, 0)))
    first = s(prompts[0], SamplingParams(seed=turn_seed(11, 0, 0)))
    for ids, task, prompt in zip((first, second), tasks, prompts):
        assert tok.decode(ids).endswith(oracle_action(task, tok.decode(prompt))), task.id
    assert first != second
    replay = script(99, keys=[(11, 1)], which=[tasks[1]])
    assert replay(prompts[1], SamplingParams(seed=turn_seed(99, 0, 0))) == second
    env.close()
