"""Mutant tasks of the fixture package through the VT-SWE episode: the oracle (view,
revert with str_replace, run tests, submit) scores 1.0 on every built task, doing
nothing 0, and the hidden tests stay out of the agent's reach."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import vt_envs
from vt_envs.domains.swe.env import make_swe_env, with_layout
from vt_envs.domains.swe.mutants import build_tasks
from vt_envs.domains.swe.oracle import DoNothingPolicy, SWEOracle, revert_edit
from vt_envs.domains.swe.tasks import materialize, swe_cache_dir
from vt_envs.errors import InvalidConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "minipkg"
FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe")
    source = root / "minipkg"
    shutil.copytree(FIXTURE, source)
    mutants = build_tasks(
        source,
        source_paths=["minipkg/mathutil.py", "minipkg/text.py"],
        test_paths=["tests/test_minipkg.py"],
        seed=1,
        max_tasks=3,
        timeout_s=30,
        env=FAST,
    )
    cache = root / "cache"
    return [
        with_layout(materialize(source, m, name="minipkg", split="test", cache=cache))
        for m in mutants
    ]


def test_materialized_trees_keep_the_hidden_tests_apart(tasks):
    for task in tasks:
        repo, pristine = Path(task.assets["repo"]), Path(task.assets["pristine"])
        hidden = task.assets["hidden_files"]
        assert hidden and all((pristine / h).is_file() and not (repo / h).exists() for h in hidden)
        path = task.assets["mutation"]["path"]
        assert (repo / path).read_text() == (pristine / path).read_text()  # the bug, in both
        assert (repo / path).read_text() != (Path(task.assets["source"]) / path).read_text()
        assert "tests/test_minipkg.py" not in task.prompt.split("Repository layout")[1]


def test_the_oracle_fixes_every_task_and_doing_nothing_does_not(tasks):
    env = make_swe_env(tasks=tasks, max_turns=8)
    for task in tasks:
        fixed = vt_envs.run_episode(env, SWEOracle(), options={"task_id": task.id})
        assert fixed.reward == 1.0 and fixed.terminated, (task.id, fixed.observations[-2:])
        assert fixed.infos[-1]["verifier_parts"]["pass_to_pass_broken"] == 0.0
        idle = vt_envs.run_episode(env, DoNothingPolicy(), options={"task_id": task.id})
        assert idle.reward == 0.0
    env.close()


def test_the_agent_cannot_read_the_hidden_tests(tasks):
    task = tasks[0]
    env = make_swe_env(tasks=tasks, max_turns=4)
    env.reset(options={"task_id": task.id})
    pristine = task.assets["pristine"]
    probe = f"cat {pristine}/tests/test_minipkg.py; ls {Path(pristine).parent}; ls /tmp/repo/tests"
    call = json.dumps({"name": "bash", "arguments": {"command": probe}})
    obs, *_ = env.step(f"<tool_call>{call}</tool_call>")
    # The cache is masked in the sandbox; the working copy holds no hidden test module.
    assert "def test_" not in obs["text"] and "No such file" in obs["text"]
    for path in (f"{pristine}/tests/test_minipkg.py", "../pristine/tests/test_minipkg.py"):
        view = json.dumps({"name": "editor", "arguments": {"command": "view", "path": path}})
        obs, *_ = env.step(f"<tool_call>{view}</tool_call>")
        assert "def test_" not in obs["text"]
    env.close()


def test_revert_edit_widens_to_a_unique_window():
    original = "x = 1\ny = a - b\nz = a - b\n"
    broken = "x = 1\ny = a - b\nz = a + b\n"
    old, new = revert_edit(broken, original)
    assert broken.count(old) == 1 and broken.replace(old, new) == original
    removed = "def f(x):\n    y = x\n    return y\n"
    assert revert_edit("def f(x):\n    return y\n", removed)[1].count("y = x") == 1


def test_a_cache_the_sandbox_could_read_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("VT_CACHE_DIR", "/var/tmp/vt-visible-cache")
    with pytest.raises(InvalidConfigError, match="readable from the agent's sandbox"):
        swe_cache_dir()
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path))
    assert swe_cache_dir() == (tmp_path / "swe").resolve()


def test_git_in_the_working_copy_shows_the_agents_change(tasks):
    task = tasks[0]
    env = make_swe_env(tasks=tasks, max_turns=4)
    env.reset(options={"task_id": task.id})
    path = task.assets["mutation"]["path"]
    command = f"echo '# note' >> {path}; git status --short; git diff --stat; git log --oneline"
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    obs, _, _, _, info = env.step(f"<tool_call>{call}</tool_call>")
    assert info["tool"]["ok"] and f" M {path}" in obs["text"]
    assert "1 file changed, 1 insertion(+)" in obs["text"] and "base" in obs["text"]
    env.close()


def test_the_evaluation_runs_only_the_modules_that_exercise_the_function(tmp_path):
    from vt_envs.domains.swe.sources import BUILTIN_REPO, repository_tasks

    tasks = repository_tasks("train", max_tasks=8, cache=tmp_path, test_fraction=0.25)
    all_modules = sorted(str(p.relative_to(BUILTIN_REPO)) for p in BUILTIN_REPO.glob("tests/*.py"))
    narrower = 0
    for task in tasks:
        covering = task.assets["test_files"]
        names = task.metadata["function"].split(".")  # a method: its class or its name
        assert set(task.assets["hidden_files"]) <= set(covering)
        assert all(t.split("::", 1)[0] in covering for t in task.assets["pass_to_pass"])
        for module in set(covering) - set(task.assets["hidden_files"]):
            text = (BUILTIN_REPO / module).read_text()
            assert any(name in text for name in names)
        narrower += len(covering) < len(all_modules)
    assert narrower == len(tasks)  # each vtutils function is tested in one module


def test_an_unpacked_src_layout_sdist_builds_and_its_tasks_are_fixed(tmp_path, monkeypatch):
    """What ``fetch`` unpacks for cachetools: ``NAME-VERSION/src/NAME`` and ``tests/``, with
    ``addopts`` naming a plugin that is not loaded. The package and tests directories are
    inferred, the build, the agent's shell and the hidden-test run import from ``src/``."""
    import gymnasium as gym

    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    sdist = tmp_path / "minipkg-0.3.1"
    shutil.copytree(FIXTURE / "minipkg", sdist / "src" / "minipkg")
    shutil.copytree(FIXTURE / "tests", sdist / "tests")
    (sdist / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--cov=minipkg"\n')
    env = gym.make("VT-SWE-v0", repo=str(sdist), max_tasks=3, split="train", max_turns=8)
    tasks = env.unwrapped.tasks
    assert len(tasks) >= 1 and all(t.id.startswith("swe/minipkg/train/") for t in tasks)
    assert all(t.assets["mutation"]["path"].startswith("src/minipkg/") for t in tasks)
    fixed = vt_envs.run_episode(env, SWEOracle(), options={"task_id": tasks[0].id})
    assert fixed.reward == 1.0, fixed.observations[-2:]
    env.reset(options={"task_id": tasks[0].id})
    bash = '{"name": "bash", "arguments": {"command": "python -c \'import minipkg; print(1+1)\'"}}'
    obs, *_ = env.step(f"<tool_call>{bash}</tool_call>")
    assert "2" in obs["text"] and "Error" not in obs["text"], obs["text"]
    env.close()
