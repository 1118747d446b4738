"""SWE-bench-format instances as VT-SWE-v0 tasks, on local checkouts, without Docker.

An instance (SWE-bench's JSON fields: ``instance_id``, ``repo``,
``problem_statement``, ``base_commit``, ``patch``, ``test_patch``,
``FAIL_TO_PASS``, ``PASS_TO_PASS``) needs the repository on disk: the user
gives, per ``repo`` name, the path of a local git checkout holding
``base_commit``, and runs the env with a Python that has the repository's
dependencies (``policy=SandboxPolicy(python=".../bin/python")``). For each
instance the loader writes, once, into the task cache:

- ``repo/``: the tree at ``base_commit`` (``git archive``; committed to a
  fresh git repository), from which the agent's working copies are made;
- ``pristine/``: the same with ``test_patch`` applied — the hidden tests,
  applied only at evaluation;
- ``source/``: the same with the gold ``patch`` applied (what the oracle
  reaches).

FAIL_TO_PASS / PASS_TO_PASS must be pytest node ids (``tests/test_x.py::test_y``),
as for pytest-based repositories; the test files run are those the ids and
the test patch name. Any other id is refused at load with
:class:`UnsupportedTestIdError` (SWE-bench's Django instances use unittest ids,
``test_y (app.tests.XTests)``, and its SymPy ones bare function names,
``test_y``): the hidden-test run is pytest's and finds each id's outcome by its
node id, so such an id would never be found and the task would score 0 as
tampered.

Import it as ``from vt_envs.domains.swe import load_swebench, make_swe_env``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vt_envs.core.task import Task, TaskList
from vt_envs.domains.swe.tasks import git_init, swe_cache_dir
from vt_envs.domains.swe.workspace import with_layout
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = ["REQUIRED_FIELDS", "UnsupportedTestIdError", "check_test_id", "load_swebench"]

REQUIRED_FIELDS = (
    "instance_id",
    "repo",
    "problem_statement",
    "base_commit",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
_VERSION = 1

# A pytest node id: a ``.py`` file path (no spaces), ``::``, then the test (a class and
# a function, or a function; parameters in brackets may hold anything).
_NODE_ID = re.compile(r"[^\s:()]+\.py::[^\s:\[()]+(::[^\s:\[()]+)*(\[.*\])?", re.DOTALL)
_DJANGO_ID = re.compile(r"\w+ \([\w.]+\)")
_BARE_NAME = re.compile(r"test\w*")


class UnsupportedTestIdError(DatasetFormatError):
    """Raised when an instance's FAIL_TO_PASS / PASS_TO_PASS holds an id that is not a
    pytest node id (SWE-bench's Django and SymPy instances), which grading cannot find."""


def check_test_id(test_id: str, field: str, instance: str) -> str:
    """``test_id`` when it is a pytest node id; raises :class:`UnsupportedTestIdError`
    naming the format expected, the one given and the fix."""
    if _NODE_ID.fullmatch(test_id):
        return test_id
    if _DJANGO_ID.fullmatch(test_id):
        style = "a Django/unittest id 'test_name (module.Class)', run by Django's runtests.py"
    elif _BARE_NAME.fullmatch(test_id):
        style = "a bare test name (SymPy's style: it names no file)"
    else:
        style = "not a pytest node id"
    raise UnsupportedTestIdError(
        f"{instance}: {field} holds {test_id!r}: {style}. VT-SWE-v0 grades with pytest and "
        "finds each test's outcome by its node id, so it needs "
        "'path/to/test_file.py::test_name' (or '...::Class::test_name'); this id would "
        "never be found and the task would score 0. Fix: rewrite the ids as pytest node ids "
        "(a bare name: prefix the test file the test patch changes, "
        "'sympy/core/tests/test_basic.py::test_name'), or leave out the instances of "
        "repositories that pytest does not run (Django)"
    )


def _ids(value: Any, field: str, instance: str) -> list[str]:
    ids = json.loads(value) if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise DatasetFormatError(f"{instance}: {field} must be a list of test ids, got {value!r}")
    return [check_test_id(i, field, instance) for i in ids]


def _read(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else [data]


def _patched_files(patch: str) -> list[str]:
    return sorted(set(re.findall(r"^\+\+\+ b/(\S+)", patch, flags=re.MULTILINE)))


def _archive(checkout: Path, commit: str, target: Path) -> None:
    """The tree of ``commit`` in ``checkout`` (the user's own repository) into ``target``."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "archive", "--format=tar", commit],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise InvalidConfigError(
            f"git archive {commit} failed in {str(checkout)!r}: "
            f"{done.stderr.decode(errors='replace').strip()}; does the checkout hold that commit?"
        )
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(target, filter="data")


def _apply(tree: Path, patch: str, what: str, instance: str) -> None:
    if not patch.strip():
        return
    done = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", "-"],
        cwd=tree,
        input=patch.encode(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise DatasetFormatError(
            f"{instance}: its {what} does not apply to base_commit: "
            f"{done.stderr.decode(errors='replace').strip()}"
        )


def _materialize(instance: dict[str, Any], checkout: Path, directory: Path) -> None:
    if (directory / "repo").is_dir():
        return
    staging = directory.with_name(directory.name + f".staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        base = staging / "base"
        _archive(checkout, instance["base_commit"], base)
        for tree, patches in (
            ("pristine", [("test_patch", instance["test_patch"])]),
            ("source", [("patch", instance["patch"])]),
        ):
            shutil.copytree(base, staging / tree, symlinks=True)
            for what, patch in patches:
                _apply(staging / tree, patch, what, instance["instance_id"])
        base.rename(staging / "repo")
        git_init(staging / "repo")
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_swebench(
    path: str | os.PathLike[str],
    *,
    checkouts: Mapping[str, str | os.PathLike[str]],
    split: str = "test",
    cache: str | os.PathLike[str] | None = None,
) -> TaskList:
    """SWE-bench-format instances (a ``.json`` list or ``.jsonl``) as VT-SWE-v0 tasks.

    Every test id is checked before anything is written (:func:`check_test_id`).

    Args:
        checkouts: ``repo`` name (``"owner/name"``) -> local git checkout.
        split: the split name the tasks report.
        cache: the task cache (default :func:`~vt_envs.domains.swe.tasks.swe_cache_dir`).

    Raises:
        DatasetFormatError: a field is missing or malformed, a patch does not apply;
            :class:`UnsupportedTestIdError` (a subclass) for a test id pytest cannot
            run by name.
        InvalidConfigError: no checkout for an instance's ``repo``, or it lacks
            ``base_commit``.
    """
    instances = _read(Path(path))
    root = (Path(cache) if cache is not None else swe_cache_dir()) / "swebench"
    tasks = []
    for instance in instances:
        missing = [f for f in REQUIRED_FIELDS if f not in instance]
        if missing:
            raise DatasetFormatError(
                f"{instance.get('instance_id', '?')}: missing {missing}; an instance needs "
                f"{list(REQUIRED_FIELDS)}"
            )
        name = instance["instance_id"]
        if instance["repo"] not in checkouts:
            raise InvalidConfigError(
                f"{name}: no local checkout of {instance['repo']!r}; pass "
                f"checkouts={{{instance['repo']!r}: 'path/to/checkout'}}"
            )
        f2p = _ids(instance["FAIL_TO_PASS"], "FAIL_TO_PASS", name)
        p2p = _ids(instance["PASS_TO_PASS"], "PASS_TO_PASS", name)
        hidden = _patched_files(instance["test_patch"])
        directory = root / re.sub(r"[^\w.-]", "_", name) / f"v{_VERSION}"
        _materialize(instance, Path(checkouts[instance["repo"]]), directory)
        test_files = sorted({*hidden, *(t.split("::", 1)[0] for t in (*f2p, *p2p))})
        tasks.append(
            with_layout(
                Task(
                    id=f"swe/swebench/{name}",
                    prompt=instance["problem_statement"].strip(),
                    gold=None,
                    metadata={"source": "swebench", "repo": instance["repo"]},
                    assets={
                        "repo": str(directory / "repo"),
                        "pristine": str(directory / "pristine"),
                        "source": str(directory / "source"),
                        "fail_to_pass": f2p,
                        "pass_to_pass": p2p,
                        "test_files": test_files,
                        "hidden_files": hidden,
                        "changed_files": _patched_files(instance["patch"]),
                        "checkout": str(Path(checkouts[instance["repo"]]).resolve()),
                    },
                )
            )
        )
    return TaskList(tasks, name="swe/swebench", split=split)
