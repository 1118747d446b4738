"""A whole VT-SWE episode on a hand-made task: the fix through the editor earns 1.0 (the
hidden test run after submit), doing nothing earns 0, and the working copy is gone after."""

from __future__ import annotations

import json
import shutil

import pytest

from vt_envs.core.task import Task
from vt_envs.domains.swe.env import make_swe_env, with_layout

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef double(x):\n    return 2 * x\n"
HIDDEN = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
VISIBLE = "from calc import double\n\n\ndef test_double():\n    assert double(4) == 8\n"


@pytest.fixture
def task(tmp_path):
    pristine = tmp_path / "pristine"
    (pristine / "tests").mkdir(parents=True)
    (pristine / "calc.py").write_text(BUGGY)
    (pristine / "tests" / "test_hidden.py").write_text(HIDDEN)
    (pristine / "tests" / "test_visible.py").write_text(VISIBLE)
    repo = tmp_path / "repo"
    shutil.copytree(pristine, repo)
    (repo / "tests" / "test_hidden.py").unlink()
    return with_layout(
        Task(
            "swe/demo/add",
            "Issue: calc.add(2, 3) returns -1, but 5 is expected.",
            None,
            assets={
                "repo": str(repo),
                "pristine": str(pristine),
                "fail_to_pass": ["tests/test_hidden.py::test_add"],
                "pass_to_pass": ["tests/test_visible.py::test_double"],
                "test_files": ["tests/test_hidden.py", "tests/test_visible.py"],
            },
        )
    )


def _call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_the_fix_scores_one_and_doing_nothing_scores_zero(task):
    env = make_swe_env(tasks=[task], max_turns=6)
    obs, info = env.reset(options={"task": task})
    assert "Issue: calc.add" in obs["text"] and "/tmp/repo/calc.py" in obs["text"]
    assert "test_hidden.py" not in obs["text"]
    workspace = env.tools["bash"].store.current(task)
    steps = [
        _call("editor", command="view", path="calc.py"),
        _call("bash", command="python -m pytest -q tests 2>&1 | tail -1; ls tests"),
        _call("editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b"),
        "<submit>add() subtracted instead of adding</submit>",
    ]
    seen = []
    for action in steps[:-1]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["tool"]["ok"], obs["text"]
        seen.append(obs["text"])
    assert "     2\t    return a - b" in seen[0]
    assert "1 passed" in seen[1] and "test_visible.py" in seen[1]
    assert "test_hidden.py" not in seen[1]  # the hidden test is not in the agent's copy
    _, reward, terminated, _, info = env.step(steps[-1])
    assert terminated and reward == 1.0
    assert info["verifier_parts"]["fail_to_pass_fixed"] == 1.0
    assert info["verifier_parts"]["pass_to_pass_broken"] == 0.0
    assert workspace.closed and not workspace.path.exists()

    env.reset(options={"task": task})
    _, reward, terminated, _, info = env.step("<submit>nothing to do</submit>")
    assert terminated and reward == 0.0 and info["verifier_parts"]["fail_to_pass_fixed"] == 0.0
    env.close()


def test_a_fix_left_unsubmitted_is_graded_at_truncation(task):
    fix = _call("editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b")
    env = make_swe_env(tasks=[task], max_turns=2)
    env.reset(options={"task": task})
    env.step(fix)
    _, reward, terminated, truncated, info = env.step(_call("editor", command="view", path="."))
    assert truncated and not terminated and info["truncation"] == "max_turns"
    assert reward == 1.0 and info["verifier_parts"]["fail_to_pass_fixed"] == 1.0
    env.close()
    ungraded = make_swe_env(tasks=[task], max_turns=2, grade_truncated=False)
    ungraded.reset(options={"task": task})
    ungraded.step(fix)
    _, reward, _, truncated, info = ungraded.step(_call("editor", command="view", path="."))
    assert truncated and reward == 0.0 and "verifier_parts" not in info
    ungraded.close()


def _bash(env, command):
    obs, *_ = env.step(_call("bash", command=command))
    return obs["text"]


def test_tmp_is_writable_in_the_agents_sandbox_and_empty_next_episode():
    """docs/envs/swe.md's promise: besides the copy, /tmp is the agent's (its own size-capped
    tmpfs); what an episode leaves there is gone in the next."""
    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)

    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test")
    try:
        env.reset(seed=0)
        text = _bash(env, "echo kept > /tmp/note.txt; cat /tmp/note.txt; df -k /tmp | tail -1")
        assert "kept\n" in text and "[exit code 0]" in text and "Permission denied" not in text
        assert "\ntmpfs " in text  # its own filesystem, size-capped
        env.reset(seed=1)
        assert "note.txt" not in _bash(env, "ls -A /tmp")
    finally:
        env.close()


def test_the_oracles_test_run_writes_its_log_to_tmp_and_passes():
    """SWEOracle runs `pytest > /tmp/pytest.txt; echo $?`: the run must really happen
    (exit status 0, the log there), not fail on the redirect unnoticed."""
    import gymnasium as gym

    import vt_envs
    from vt_envs.domains.swe.oracle import SWEOracle

    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test")
    try:
        result = vt_envs.run_episode(env, SWEOracle(), seed=0)
        assert result.reward == 1.0
        ((action, observation),) = [
            (a, o)
            for a, o in zip(result.actions, result.observations[1:])
            if "/tmp/pytest.txt" in a
        ]
        assert "\n0\n[exit code 0]" in observation, observation[-300:]
    finally:
        env.close()
