"""Shipped validated mutant lists (:mod:`vt_envs.domains.swe.validated`): a build from one
gives the tasks a validated build gives, a list whose key is not the repository's is not
used, and the lists in VT's assets are what ``fetch --defaults --write-shipped`` writes.
"""

from __future__ import annotations

import json
import shutil

import pytest

from vt_envs.domains.swe import validated
from vt_envs.domains.swe.default_repos import (
    DEFAULT_REPO_NAMES,
    DEFAULT_REPOS,
    default_mutants,
    ensure_repo,
)
from vt_envs.domains.swe.sources import (
    BUILTIN_REPO,
    BuildLimits,
    repository_mutants,
    repository_tasks,
)
from vt_envs.domains.swe.tasks import swe_cache_dir
from vt_envs.domains.swe.validated import dumps, loads, shipped_path

# Small builds: a few mutants, a handful of test runs.
_SMALL = BuildLimits(max_tasks=6, max_per_function=1, max_runs=10, narrow_tests=True)
_TINY = BuildLimits(max_tasks=2, max_per_function=1, max_runs=4, narrow_tests=True)


def _where(repo: str) -> dict:
    if repo == "vtutils":
        return {"repo": BUILTIN_REPO, "name": "vtutils"}
    spec = DEFAULT_REPOS[repo]
    return {"repo": ensure_repo(spec, swe_cache_dir()), "name": spec.name,
            "source_dir": spec.source_dir, "test_dir": spec.test_dir}  # fmt: skip


def _ship(built, directory, monkeypatch):
    """Ship ``built`` from ``directory`` (instead of VT's assets)."""
    monkeypatch.setattr(validated, "SHIPPED_DIR", directory)
    path = shipped_path(built.name)
    path.write_text(dumps(built.mutants, repo=built.snapshot, name=built.name, key=built.key,
                          seed=built.seed, limits=built.limits))  # fmt: skip
    return path


def _view(task) -> tuple:
    """What an agent and the grader see of a task."""
    keys = ("fail_to_pass", "pass_to_pass", "test_files", "hidden_files", "mutation")
    return task.id, task.prompt, task.metadata, {k: task.assets[k] for k in keys}


@pytest.mark.parametrize("repo", ["vtutils", pytest.param("toolz", marks=pytest.mark.slow)])
def test_a_shipped_list_builds_the_tasks_a_validated_build_does(repo, tmp_path, monkeypatch):
    where = _where(repo)
    checked = repository_mutants(**where, limits=_SMALL, cache=tmp_path / "a", validate=True)
    assert checked.origin == "validated" and len(checked.mutants) >= 2
    _ship(checked, tmp_path, monkeypatch)
    shipped = repository_mutants(**where, limits=_SMALL, cache=tmp_path / "b")
    assert shipped.origin == "shipped" and shipped.key == checked.key
    assert shipped.mutants == checked.mutants  # mutant files and PASS_TO_PASS included
    for split in ("train", "test"):
        a, b = (repository_tasks(split, **where, limits=_SMALL, cache=tmp_path / c) for c in "ab")
        assert [_view(t) for t in a] == [_view(t) for t in b] and len(a) > 0, split
        assert all(t.assets["pass_to_pass"] for t in b)


def test_a_list_whose_key_is_not_the_repositorys_is_not_used(tmp_path, monkeypatch):
    checked = repository_mutants(limits=_TINY, cache=tmp_path / "a", validate=True)
    _ship(checked, tmp_path, monkeypatch)
    edited = tmp_path / "vtutils"
    shutil.copytree(BUILTIN_REPO, edited, ignore=shutil.ignore_patterns("__pycache__"))
    module = edited / checked.mutants[0].mutation.path
    module.write_text(module.read_text() + "\n# one more line\n")
    rebuilt = repository_mutants(repo=edited, limits=_TINY, cache=tmp_path / "b")
    assert rebuilt.key != checked.key and rebuilt.origin == "validated"
    # Its own seed and limits, another's key: each is refused.
    text = shipped_path("vtutils").read_text()
    same = {"repo": BUILTIN_REPO, "key": checked.key, "seed": 0, "limits": _TINY}
    assert loads(text, **same) == checked.mutants
    assert loads(text, **{**same, "key": rebuilt.key}) is None
    assert loads(text, **{**same, "seed": 1}) is None
    assert loads(text, **{**same, "limits": BuildLimits(max_tasks=5)}) is None
    # A mutant file that is not the validated one is refused too.
    data = json.loads(text)
    data["tasks"][0]["edit"][2] += " "
    assert loads(json.dumps(data), **same) is None


@pytest.mark.parametrize("repo", DEFAULT_REPO_NAMES)
def test_the_shipped_lists_are_what_write_shipped_writes(repo):
    """Their keys are the pinned sources' digests; a changed pinned version, mutation or
    generator fails here: rerun ``fetch --defaults --validate --write-shipped``."""
    spec = DEFAULT_REPOS.get(repo)
    path = shipped_path(repo, spec.version if spec else None)
    assert path.is_file(), f"{path} is missing: run fetch --defaults --validate --write-shipped"
    built = default_mutants(repo)
    assert built.origin in ("cache", "shipped")
    stored = json.loads(path.read_text())
    assert (stored["key"], stored["seed"]) == (built.key, 0), "another build's list"
    text = dumps(built.mutants, repo=built.snapshot, name=repo, key=built.key, seed=0,
                 limits=built.limits, version=spec.version if spec else None)  # fmt: skip
    assert path.read_text() == text
