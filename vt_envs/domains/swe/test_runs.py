"""Running a repository's pytest tests in a subprocess, under a deadline, by node id.

:func:`run_tests` runs pytest in a temporary copy's directory with a fresh
environment, writes a JUnit report and reads every test's outcome back as a
pytest node id (:func:`junit_node_id` inverts JUnit's dotted names with a map
of the repository's files made once per report: linear, however many dots a
name holds; reports are capped in size and test cases). On timeout the whole
process group is killed. Used at task build time on trusted repositories; an
agent's code is only ever run in the sandbox, and graded without any report
file (:mod:`~vt_envs.domains.swe.evaluation`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vt_envs.errors import InvalidConfigError

__all__ = [
    "NOT_COPIED",
    "ModuleMap",
    "TestReport",
    "junit_node_id",
    "module_map",
    "run_tests",
]

#: Not copied into a test run's working copy: caches, VCS data, virtualenvs.
NOT_COPIED = (".git", ".hg", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache")
NOT_COPIED += (".tox", ".nox", ".venv", "venv", "*.pyc")
_OUTPUT_TAIL_CHARS = 4000
# No cache written into the repository; the JUnit layout junit_node_id inverts; a module
# that fails to import stops no other module's tests.
_PYTEST_OPTIONS = ("-q", "-rfE", "--tb=short", "-p", "no:cacheprovider")
_PYTEST_OPTIONS += ("-o", "junit_family=xunit2", "--continue-on-collection-errors")
# The repository's own addopts (coverage, xdist, ...) need plugins the run does not load.
_PYTEST_OPTIONS += ("-o", "addopts=")


# --------------------------------------------------------------------------- test runs


@dataclass(frozen=True)
class TestReport:
    """What one pytest run did.

    Attributes:
        passed, failed, errors: pytest node ids (``tests/test_x.py::TestK::test_y[p]``)
            by outcome; skipped tests are in none of them. A module that failed to
            import is in ``errors`` under its file's id (its tests are then in no set).
        timed_out: the run hit its deadline and was killed (the sets are then empty).
        duration_s: wall time of the run.
        output_tail: the last characters of pytest's output (stdout and stderr).
        messages: each failed or errored id's one-line-ish failure message (JUnit's
            ``message``: ``"assert 4 == 5\\n +  where 4 = f(1)"``), in execution order.
    """

    __test__ = False  # not a pytest test class, though its name says so

    passed: frozenset[str]
    failed: frozenset[str]
    errors: frozenset[str]
    timed_out: bool
    duration_s: float
    output_tail: str
    messages: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)


def run_tests(
    repo: Path,
    test_paths: Sequence[str],
    *,
    timeout_s: float,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> TestReport:
    """Run pytest on ``test_paths`` (files, directories or node ids, relative to ``repo``).

    The run happens in ``repo`` itself (callers that must keep a checkout clean
    pass a copy, as :func:`validate` does), with ``python -m pytest``, no cache
    provider, ``--rootdir=repo`` (so ids are relative to it) and a JUnit XML
    report written outside the repository, in an environment that is this
    process's minus every ``PYTHON*`` and ``PYTEST_*`` variable, plus
    ``PYTHONPATH`` = the repository root (and its ``src/``, if any: the package
    imports from the working copy), ``PYTHONDONTWRITEBYTECODE=1`` and
    ``PYTHONHASHSEED=0`` (set ordering cannot make a mutant flaky), plus ``env``
    (e.g. ``{"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}`` for a repository that needs
    no plugins: pytest then starts in a fifth of the time).

    At ``timeout_s`` the run's whole process group is killed (tests that spawn
    children included) and the report says ``timed_out``.

    Raises:
        InvalidConfigError: no test paths, a non-positive timeout, or ``python``
            cannot be started.
    """
    if not test_paths or isinstance(test_paths, str):
        raise InvalidConfigError(
            f"test_paths must be a non-empty list of test files or node ids relative to the "
            f"repository, got {test_paths!r}"
        )
    if timeout_s <= 0:
        raise InvalidConfigError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    repo = Path(repo).resolve()
    with tempfile.TemporaryDirectory(prefix="vt-swe-run-") as scratch:
        junit, log = Path(scratch) / "junit.xml", Path(scratch) / "output.txt"
        options = [f"--rootdir={repo}", f"--junitxml={junit}", *_PYTEST_OPTIONS]
        command = [python, "-m", "pytest", *options, *test_paths]
        started = time.monotonic()
        with log.open("wb") as out:
            timed_out = _run_killable(command, repo, _fresh_env(repo, env), out, timeout_s)
        duration = time.monotonic() - started
        tail = log.read_bytes()[-_OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace")
        passed, failed, errors, messages = set(), set(), set(), {}
        if not timed_out and junit.is_file():
            passed, failed, errors, messages = _read_junit(junit, repo)
    return TestReport(
        frozenset(passed), frozenset(failed), frozenset(errors), timed_out, duration, tail, messages
    )


def _fresh_env(repo: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    # This process's PATH, HOME and locale, but none of its Python or pytest settings:
    # a PYTHONPATH or PYTEST_ADDOPTS meant for the caller (say, the pytest session
    # running this) must not leak into the repository's tests.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST_"))}
    roots = [repo, *([repo / "src"] if (repo / "src").is_dir() else [])]
    env.update(
        PYTHONPATH=os.pathsep.join(map(str, roots)),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
    )
    env.update(extra or {})
    return env


def _run_killable(command: list[str], cwd: Path, env: dict, out, timeout_s: float) -> bool:
    """Run ``command`` in a new session; return whether it was killed at ``timeout_s``."""
    try:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so one killpg reaches all
        )
    except OSError as error:
        raise InvalidConfigError(
            f"cannot start {command[0]!r} ({error}); pass python= the interpreter of the "
            "repository's environment (with pytest installed)"
        ) from None
    try:
        process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    # Also after a normal exit: a test may have left children running in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return timed_out


#: The largest JUnit report read, and the most test cases taken from one (beyond: the
#: run reports nothing; a repository's honest report is far smaller).
MAX_JUNIT_BYTES = 64 << 20
MAX_JUNIT_CASES = 200_000
#: The most ``.py`` files mapped for :func:`junit_node_id` (a repository has far fewer).
MAX_MODULES = 200_000
_SKIPPED_DIRS = frozenset(n for n in NOT_COPIED if not n.startswith("*"))


def _read_junit(path: Path, repo: Path) -> tuple[set, set, set, dict]:
    passed, failed, errors, messages = set(), set(), set(), {}
    try:
        if path.stat().st_size > MAX_JUNIT_BYTES:
            return passed, failed, errors, messages
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return passed, failed, errors, messages  # pytest died while writing it
    modules = module_map(repo)
    for count, case in enumerate(root.iter("testcase")):
        if count >= MAX_JUNIT_CASES:
            return set(), set(), set(), {}
        test_id = junit_node_id(case.get("classname", ""), case.get("name", ""), repo, modules)
        tags = {child.tag: child for child in case}
        if "error" in tags or "failure" in tags:  # both: a failure, then an error in teardown
            (errors if "error" in tags else failed).add(test_id)
            problem = tags["failure"] if "failure" in tags else tags["error"]
            messages.setdefault(test_id, problem.get("message") or "")
        elif "skipped" not in tags:
            passed.add(test_id)
    return passed, failed, errors, messages


class ModuleMap(dict):
    """:func:`module_map`'s result: dotted name -> file; ``depth``: the most parts a
    dotted name of it has."""

    depth: int = 0


def module_map(repo: Path) -> ModuleMap:
    """Every ``.py`` file under ``repo`` (caches, VCS data and virtualenvs skipped, links
    not followed, at most :data:`MAX_MODULES`) by its dotted name: ``"tests.sub.test_x"``
    -> ``"tests/sub/test_x.py"``. Where two files share a dotted name (``a/b.py`` and
    ``a.b.py``), the first in sorted order is kept."""
    found = ModuleMap()
    stack = [""]
    while stack and len(found) < MAX_MODULES:
        rel = stack.pop()
        try:
            entries = sorted(os.scandir(repo / rel) if rel else os.scandir(repo), key=_name)
        except OSError:
            continue
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in _SKIPPED_DIRS:
                    stack.append(path)
            elif entry.name.endswith(".py") and entry.is_file(follow_symlinks=False):
                found.setdefault(path[:-3].replace("/", "."), path)
                found.depth = max(found.depth, path.count("/") + path[:-3].count(".") + 1)
    return found


def _name(entry: os.DirEntry) -> str:
    return entry.name


def junit_node_id(classname: str, name: str, repo: Path, modules: ModuleMap | None = None) -> str:
    """pytest's node id from a JUnit test case (the inverse of its ``mangle_test_address``).

    JUnit writes ``tests/sub/test_x.py::TestK::test_y[a.b]`` as classname
    ``tests.sub.test_x.TestK`` and name ``test_y[a.b]``; which dots were slashes
    (a directory or file name may hold dots too) is found in ``modules``
    (:func:`module_map` of ``repo``, made here if not given): the longest dotted
    prefix that names a file. Linear in the classname's length times the depth of
    the deepest file, however many dots it holds. A module that failed to import
    has no classname and its dotted path as name.
    """
    modules = module_map(repo) if modules is None else modules
    parts, tail = (classname.split("."), [name]) if classname else (name.split("."), [])
    for k in range(min(len(parts), modules.depth), 0, -1):  # the longest name first
        path = modules.get(".".join(parts[:k]))
        if path is not None:
            return "::".join([path, *parts[k:], *tail])
    return "::".join(["/".join(parts) + ".py", *tail])
