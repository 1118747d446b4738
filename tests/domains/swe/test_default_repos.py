"""VT-SWE-v0's default repositories: pinned sdists fetched into the task cache, chosen with
``repos=``, refused with a typed error when they cannot be fetched, and solvable through
``gym.make(...).step`` (the oracle scores 1.0 on a held-out task of each, doing nothing 0).

The tests that read the default repositories use the real task cache, which
``make test`` fills at install (``python -m vt_envs.domains.swe.fetch --defaults``).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import gymnasium as gym
import pytest
from test_fetch import _sdist  # the mini_pkg sdist that pip prepares without a network

import vt_envs
from vt_envs.domains.swe import default_repos
from vt_envs.domains.swe.default_repos import (
    BUILTIN,
    DEFAULT_REPO_NAMES,
    DEFAULT_REPOS,
    RepositoryUnavailableError,
    RepoSpec,
    ensure_repo,
)
from vt_envs.domains.swe.env import default_tasks
from vt_envs.domains.swe.oracle import DoNothingPolicy, SWEOracle
from vt_envs.domains.swe.sources import BuildLimits
from vt_envs.errors import InvalidConfigError


def test_every_default_repository_is_pinned_to_one_file():
    assert DEFAULT_REPO_NAMES[0] == BUILTIN and len(DEFAULT_REPOS) >= 4
    for name, spec in DEFAULT_REPOS.items():
        assert spec.name == name and re.fullmatch(r"\d+(\.\d+)+", spec.version), spec
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256), spec
        assert spec.pinned == f"{spec.requirement}=={spec.version}"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"repos": ["toolzz"]}, "Did you mean 'toolz'"),
        ({"repos": "toolz"}, r"repos must be Sequence\[str\] \| None, got 'toolz'"),
        ({"repos": []}, "non-empty list"),
        ({"repos": ["toolz"], "repo": "somewhere"}, "cannot be combined with repo="),
    ],
    ids=["typo", "string", "empty", "with-repo"],
)
def test_a_bad_repos_keyword_is_refused_with_the_fix(kwargs, match):
    with pytest.raises(InvalidConfigError, match=match) as caught:
        gym.make("VT-SWE-v0", **kwargs)
    said = str(caught.value)  # the names to choose from, or the form to give them in
    assert "vtutils" in said or "repo=" in said or "Sequence[str]" in said


def _offline(monkeypatch, tmp_path):
    index = tmp_path / "index"
    index.mkdir(exist_ok=True)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def test_an_uncached_default_repository_offline_raises_a_typed_error(tmp_path, monkeypatch):
    """Never a silent fall-back to vtutils alone: the scores would mean something else."""
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    _offline(monkeypatch, tmp_path)
    with pytest.raises(RepositoryUnavailableError) as caught:
        gym.make("VT-SWE-v0", repos=["parse"], split="test")
    message = str(caught.value)
    assert "parse==1.22.4" in message and "--defaults" in message and "['vtutils']" in message
    assert isinstance(caught.value, vt_envs.errors.VTError)


def test_a_changed_sdist_is_refused_and_the_pinned_one_is_cached_once(tmp_path, monkeypatch):
    index = _offline(monkeypatch, tmp_path)
    digest = hashlib.sha256(_sdist(index).read_bytes()).hexdigest()
    spec = RepoSpec("mini", "mini-pkg", "0.3.1", "0" * 64, "mini_pkg", "tests", BuildLimits())
    cache = tmp_path / "cache"
    with pytest.raises(RepositoryUnavailableError, match="HASHES"):
        ensure_repo(spec, cache)
    assert not (cache / "repos" / "mini-0.3.1").exists()
    spec = RepoSpec("mini", "mini-pkg", "0.3.1", digest, "mini_pkg", "tests", BuildLimits())
    tree = ensure_repo(spec, cache)
    assert tree == cache / "repos" / "mini-0.3.1" and (tree / "mini_pkg" / "__init__.py").is_file()
    monkeypatch.setattr(default_repos, "fetch_sdist", lambda *a, **k: pytest.fail("fetched"))
    assert ensure_repo(spec, cache) == tree
    assert sorted(p.name for p in (cache / "repos").iterdir()) == ["mini-0.3.1"]


def test_the_default_task_set_names_every_repository_in_its_ids():
    for split in ("train", "test"):
        tasks = default_tasks(split)
        repos = [tasks[i].metadata["repo"] for i in range(len(tasks))]
        assert set(repos) == set(DEFAULT_REPO_NAMES), split
        for i in range(len(tasks)):
            assert tasks[i].id.startswith(f"swe/{repos[i]}/{split}/")
    env = gym.make("VT-SWE-v0", repos=["toolz"], split="test")
    source = env.unwrapped.tasks
    assert {source[i].metadata["repo"] for i in range(len(source))} == {"toolz"}
    env.close()


# Two by default (toolz; cachetools: src/ layout and subTests, which grading once scored
# 0); every repository's held-out tasks in the slow test below.
@pytest.mark.parametrize("repo", ["toolz", "cachetools"])
def test_the_oracle_fixes_a_held_out_task(repo):
    env = gym.make("VT-SWE-v0", repos=[repo], split="test", max_turns=12)
    source = env.unwrapped.tasks
    task = source[0]
    fixed = vt_envs.run_episode(env, SWEOracle(), options={"task_id": task.id})
    assert fixed.reward == 1.0, (task.id, fixed.observations[-3:])
    idle = vt_envs.run_episode(env, DoNothingPolicy(), options={"task_id": task.id})
    assert idle.reward == 0.0 and idle.terminated
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("repo", DEFAULT_REPO_NAMES)
def test_the_oracle_fixes_every_held_out_task_of_each_repository(repo):
    env = gym.make("VT-SWE-v0", repos=[repo], split="test", max_turns=12)
    source = env.unwrapped.tasks
    for i in range(len(source)):
        task = source[i]
        fixed = vt_envs.run_episode(env, SWEOracle(), options={"task_id": task.id})
        assert fixed.reward == 1.0, (task.id, fixed.observations[-3:])
        idle = vt_envs.run_episode(env, DoNothingPolicy(), options={"task_id": task.id})
        assert idle.reward == 0.0, task.id
    env.close()


def test_the_command_fetches_and_builds_the_chosen_defaults():
    done = subprocess.run(
        [sys.executable, "-m", "vt_envs.domains.swe.fetch", "--defaults", "--repos", "vtutils"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    assert re.fullmatch(
        r"vtutils: \d+ train / \d+ test tasks \(\d+\.\d s: fetch \d+\.\d s, mutants \d+\.\d s "
        r"\[(cache|shipped)\], task trees \d+\.\d s\)\n",
        done.stdout,
    )
