"""Mutant tasks as VT-SWE-v0 tasks: the broken repository on disk, its hidden tests apart.

:func:`materialize` writes, for one :class:`~vt_envs.domains.swe.mutants.MutantTask`
of a repository, two trees under the task cache (once; later calls reuse them):

- ``pristine/``: the repository with the mutant file — the bug — and every
  test, which the evaluation restores test files from;
- ``repo/``: the same without the hidden tests (every test module that holds
  a FAIL_TO_PASS test), committed to a fresh git repository, from which each
  episode's working copy is made (so ``git diff`` shows the agent's change).

The hidden-test run is limited to the test modules that exercise the mutated
function (:func:`covering_modules`); PASS_TO_PASS keeps the tests of those.

The cache must lie where no sandbox can read it: under a root every sandbox
masks (``/root``, ``/home``, ``/tmp``; the default ``~/.cache/vt_envs``
is). A cache elsewhere is refused, since the agent's bash could read the
hidden tests from it. The task's ``assets["mutation"]`` (privileged, never
shown to the agent) lets an oracle revert the bug.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from vt_envs.core.cache import vt_cache_root
from vt_envs.core.task import Task
from vt_envs.domains.swe.mutants import MutantTask
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.isolation import masked_in_sandbox

__all__ = [
    "LAYOUT_VERSION",
    "covering_modules",
    "git_init",
    "materialize",
    "swe_cache_dir",
    "swe_cache_root",
]

#: Bump when the trees' layout changes (the cache then writes new ones).
LAYOUT_VERSION = 2
_SKIP = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "*.pyc", ".venv")


def swe_cache_root() -> Path:
    """``$VT_CACHE_DIR/swe`` (default ``~/.cache/vt_envs/swe``), unchecked."""
    return (vt_cache_root() / "swe").resolve()


def swe_cache_dir() -> Path:
    """``$VT_CACHE_DIR/swe`` (default ``~/.cache/vt_envs/swe``), refused unless sandboxes
    mask it (see the module docstring)."""
    path = swe_cache_root()
    if not masked_in_sandbox(str(path)):
        raise InvalidConfigError(
            f"the SWE task cache {str(path)!r} would be readable from the agent's sandbox (it "
            "holds the hidden tests); set VT_CACHE_DIR to a directory under your home or /tmp"
        )
    return path


def _hidden_files(task: MutantTask) -> list[str]:
    return sorted({test_id.split("::", 1)[0] for test_id in task.fail_to_pass})


def covering_modules(source: Path, mutant: MutantTask) -> list[str]:
    """The test modules that exercise the mutated function: those holding a FAIL_TO_PASS
    test, and those whose text names the function (or, for a method, its class). The
    evaluation runs only these, so it takes seconds even where the whole suite does not."""
    names = {mutant.mutation.function.split(".")[0], mutant.mutation.function.split(".")[-1]}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
    modules = {t.split("::", 1)[0] for t in (*mutant.fail_to_pass, *mutant.pass_to_pass)}
    hidden = set(_hidden_files(mutant))
    return sorted(
        m
        for m in modules
        if m in hidden or pattern.search((source / m).read_text(errors="replace"))
    )


def materialize(
    source: str | os.PathLike[str],
    mutant: MutantTask,
    *,
    name: str,
    split: str,
    cache: str | os.PathLike[str] | None = None,
    test_env: dict[str, str] | None = None,
) -> Task:
    """The env task of ``mutant`` of the repository at ``source`` (see the module docstring).

    ``name`` names the repository in task ids (``swe/<name>/<split>/<mutation id>``);
    ``test_env``: the variables the mutant was validated with, which the evaluation uses.
    """
    directory = Path(cache) if cache is not None else swe_cache_dir()
    directory = directory / name / f"{mutant.mutation.id}-v{LAYOUT_VERSION}"
    if not (directory / "repo").is_dir():
        _write_trees(Path(source), mutant, directory)
    mutation = mutant.mutation
    covering = covering_modules(Path(source), mutant)
    pass_to_pass = [t for t in mutant.pass_to_pass if t.split("::", 1)[0] in covering]
    return Task(
        id=f"swe/{name}/{split}/{mutation.id}",
        prompt=mutant.issue_text,
        gold=None,
        metadata={"repo": name, "kind": mutation.kind, "function": mutation.function},
        assets={
            "repo": str(directory / "repo"),
            "pristine": str(directory / "pristine"),
            "source": str(Path(source)),  # the unmutated repository (for oracles)
            "fail_to_pass": list(mutant.fail_to_pass),
            "pass_to_pass": pass_to_pass,
            "test_files": covering,
            "hidden_files": _hidden_files(mutant),
            "test_env": dict(test_env or {}),
            "mutation": {
                "path": mutation.path,
                "lineno": mutation.lineno,
                "original": mutation.original,
                "mutated": mutation.mutated,
            },
        },
    )


def git_init(repo: Path) -> None:
    """Make ``repo`` a git repository with one commit of its files (our own, trusted
    files: git never runs on the agent's copy outside the sandbox), so the agent's
    ``git diff`` / ``git status`` show its change. Skipped where git is missing."""
    git = shutil.which("git")
    if git is None:
        return
    env = {
        "GIT_AUTHOR_NAME": "vt", "GIT_AUTHOR_EMAIL": "vt@localhost",
        "GIT_COMMITTER_NAME": "vt", "GIT_COMMITTER_EMAIL": "vt@localhost",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00",
        "HOME": str(repo), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }  # fmt: skip
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run([git, *args], cwd=repo, env=env, check=True, capture_output=True)


def _write_trees(source: Path, mutant: MutantTask, directory: Path) -> None:
    """Write ``pristine/`` and ``repo/`` into a temporary sibling, then rename it in place
    (a crash leaves no half-written task; a concurrent writer's result is kept)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=directory.parent))
    try:
        pristine, repo = staging / "pristine", staging / "repo"
        shutil.copytree(source, pristine, ignore=_SKIP)
        (pristine / mutant.mutation.path).write_text(mutant.mutation.mutant_source)
        shutil.copytree(pristine, repo)
        for rel in _hidden_files(mutant):
            (repo / rel).unlink(missing_ok=True)
        git_init(repo)
        try:
            staging.rename(directory)
        except OSError:  # another process wrote it first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
