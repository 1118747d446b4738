"""Hidden-test evaluation of an agent's change, in a fresh sandbox, on the pristine tree.

The agent never sees the hidden tests: they live in the task's pristine
repository in the task cache (under a root every sandbox masks; the agent's
working copy was made without them). The evaluation never runs pytest in the
agent's tree either. It copies the pristine repository and applies to it
only the agent's *source* changes (:func:`agent_changes`): files it edited,
added or deleted, except anything that could steer the test run rather
than the code under test —

- test files (the task's, and any ``test_*.py`` / ``*_test.py`` or file in
  a ``tests`` / ``test`` directory) and every pytest configuration file
  (``conftest.py``, ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``,
  ``.pytest.toml``, ``pyproject.toml``, ``tox.ini``, ``setup.cfg``);
- dotfiles and dot-directories, ``__pycache__`` and compiled files,
  ``*.pth``, ``*.dist-info`` / ``*.egg-info``, ``sitecustomize.py`` /
  ``usercustomize.py``, and new top-level modules (which could shadow
  pytest or the standard library).

pytest then runs as ``python -P -m pytest`` (the repository is not first on
``sys.path``; pytest adds it after it has imported itself, ``-o
pythonpath=.``, and ``src`` in a src layout), with the repository's
``addopts`` dropped (they name plugins the run does not load), plugin
autoloading off, no bytecode written (and none of the agent's read), and
two canary tests drawn for this run (one must fail,
one must pass): a run whose canaries misbehave was tampered with and scores
0. The report is JUnit XML read back through the sandboxed shell between
random markers. The package code the tests import is the agent's and runs
in pytest's process, so code written to subvert the run from inside can
still succeed; the canaries catch the blunt forms (everything marked
passed), not one that marks exactly the named failing tests.
"""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from vt_envs.domains.swe.files import PathError, SafeRoot
from vt_envs.domains.swe.test_runs import junit_node_id
from vt_envs.domains.swe.workspace import SHOWN_AS, Workspace
from vt_envs.sandbox.bash_session import BashSession
from vt_envs.sandbox.isolation import Isolation

__all__ = ["CONFIG_FILES", "Changes", "TestOutcome", "agent_changes", "run_hidden_tests"]

#: Files that configure pytest; the agent's versions never reach an evaluation.
CONFIG_FILES = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
_STARTUP_FILES = ("sitecustomize.py", "usercustomize.py")
#: The most files and bytes of changes an evaluation applies (more: refused, scored 0).
MAX_CHANGED_FILES = 2000
MAX_CHANGED_BYTES = 32 << 20
MAX_WALKED = 200_000


@dataclass(frozen=True)
class TestOutcome:
    """What the hidden tests did on the agent's change.

    Attributes:
        passed / failed: test ids (``tests/test_x.py::test_y``) by outcome
            (errors and skips count as failed: a test must pass).
        status: ``"ok"``, ``"timeout"``, ``"no_report"`` (pytest wrote none),
            ``"tampered"`` (the canaries misbehaved) or ``"too_large"`` (the
            change exceeds :data:`MAX_CHANGED_FILES` / :data:`MAX_CHANGED_BYTES`).
        elapsed_s: wall time of the run.
        output: the tail of pytest's output (for ``info``, never for the agent).
        ignored: the agent's changed paths left out (tests, configuration...).
    """

    passed: frozenset[str] = field(default_factory=frozenset)
    failed: frozenset[str] = field(default_factory=frozenset)
    status: str = "ok"
    elapsed_s: float = 0.0
    output: str = ""
    ignored: tuple[str, ...] = ()


@dataclass
class Changes:
    """The agent's change to the repository, as files to write and to delete."""

    written: dict[str, bytes] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    too_large: bool = False


def _steers_tests(rel: str, test_files: set[str], pristine: Path) -> bool:
    """Whether an agent's file at ``rel`` could steer the test run (never applied)."""
    parts = PurePosixPath(rel).parts
    name = parts[-1]
    if rel in test_files or name in CONFIG_FILES or name in _STARTUP_FILES:
        return True
    if any(p.startswith(".") or p == "__pycache__" for p in parts):
        return True
    if any(p.endswith((".dist-info", ".egg-info")) for p in parts[:-1]):
        return True
    if name.endswith((".pyc", ".pyo", ".pth")) or name.startswith("test_"):
        return True
    if name.endswith("_test.py") or any(p in ("tests", "test") for p in parts[:-1]):
        return True
    # A new top-level module or package could shadow pytest or the standard library.
    return len(parts) <= 2 and not (pristine / parts[0]).exists()


def agent_changes(files: SafeRoot, pristine: Path, test_files: Sequence[str]) -> Changes:
    """The agent's edits, additions and deletions relative to ``pristine``, minus what
    could steer the test run (see the module docstring)."""
    changes, tests = Changes(), set(test_files)
    seen: set[str] = set()
    size = 0
    for walked, entry in enumerate(files.walk()):
        if walked >= MAX_WALKED:
            changes.too_large = True
            return changes
        if entry.is_dir:
            continue
        seen.add(entry.path)
        if _steers_tests(entry.path, tests, pristine) or files.kind(entry.path) != "file":
            # (Symlinks and fifos are never applied either.)
            if not _unchanged(files, pristine, entry.path):
                changes.ignored.append(entry.path)
            continue
        data = files.read(entry.path, max_bytes=MAX_CHANGED_BYTES)
        original = pristine / entry.path
        if original.is_file() and not original.is_symlink() and original.read_bytes() == data:
            continue
        size += len(data)
        changes.written[entry.path] = data
        if len(changes.written) > MAX_CHANGED_FILES or size > MAX_CHANGED_BYTES:
            changes.too_large = True
            return changes
    for path in sorted(p for p in pristine.rglob("*") if p.is_file() and ".git" not in p.parts):
        rel = str(path.relative_to(pristine))
        if rel not in seen and not _steers_tests(rel, tests, pristine):
            changes.deleted.append(rel)
    return changes


def _unchanged(files: SafeRoot, pristine: Path, rel: str) -> bool:
    original = pristine / rel
    if files.kind(rel) != "file" or not original.is_file() or original.is_symlink():
        return False
    try:
        return files.read(rel, max_bytes=MAX_CHANGED_BYTES) == original.read_bytes()
    except PathError:
        return False


def _parse(xml: str, pristine: Path) -> tuple[set[str], set[str]]:
    """Passed and failed node ids of a JUnit report (the file layout looked up in the
    pristine repository, which the agent cannot change)."""
    root = ET.fromstring(xml)
    passed, failed = set(), set()
    for case in root.iter("testcase"):
        test_id = junit_node_id(case.get("classname", ""), case.get("name", ""), pristine)
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            failed.add(test_id)
        else:
            passed.add(test_id)
    return passed, failed


def _canaries(copy: Workspace, nonce: str) -> tuple[str, str]:
    """Write this run's canary module; return the ids of the test that must fail and of
    the one that must pass."""
    value = int(nonce[:8], 16)
    rel = f"vt_canary_{nonce}.py"
    copy.files.write(
        rel,
        (
            f"def test_must_fail_{nonce}():\n    assert {value} == {value + 1}\n\n\n"
            f"def test_must_pass_{nonce}():\n    assert {value} + 1 == {value + 1}\n"
        ).encode(),
    )
    return f"{rel}::test_must_fail_{nonce}", f"{rel}::test_must_pass_{nonce}"


async def run_hidden_tests(
    agent_copy: Workspace,
    *,
    pristine: Path,
    test_ids: Sequence[str],
    test_files: Sequence[str],
    isolation: Isolation,
    timeout_s: float = 60.0,
    test_env: Mapping[str, str] | None = None,
) -> TestOutcome:
    """Run ``test_ids`` (from ``test_files``) on ``pristine`` plus the agent's change.

    ``pristine``: the task's repository before the agent, hidden tests
    included. The interpreter is the sandbox's (``isolation.policy.python``);
    pytest must be importable by it. ``test_env``: variables for the run, the
    same the task was validated with.
    """
    changes = agent_changes(agent_copy.files, pristine, test_files)
    if changes.too_large:
        return TestOutcome(frozenset(), frozenset(test_ids), "too_large")
    copy = Workspace(pristine)
    try:
        for rel, data in changes.written.items():
            copy.files.write(rel, data, create_parents=True)
        for rel in changes.deleted:
            copy.files.remove(rel)
        nonce = secrets.token_hex(8)
        must_fail, must_pass = _canaries(copy, nonce)
        report = f"/tmp/work/report-{nonce}.xml"
        ids = " ".join(_quote(t) for t in (*test_ids, must_fail, must_pass))
        env = {
            **(test_env or {}),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            # Nothing compiled is written, and the tree holds no bytecode of the agent's
            # (caches are never copied from its tree), so only the installed libraries'
            # own caches are read: a fresh cache prefix made pytest recompile itself
            # every run (0.62 s instead of 0.16 s).
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        roots = ". src" if (pristine / "src").is_dir() else "."  # a src/ layout imports from src
        variables = " ".join(f"{k}={_quote(v)}" for k, v in env.items())
        command = (
            f"cd {SHOWN_AS} && {variables} {_quote(isolation.policy.python)} -P -m pytest -q "
            f"-p no:cacheprovider -o addopts= -o pythonpath={_quote(roots)} --rootdir={SHOWN_AS} "
            f"--junitxml={report} "
            f"-o junit_family=xunit1 {ids} > /tmp/work/out-{nonce}.txt 2>&1; "
            f"tail -c 2000 /tmp/work/out-{nonce}.txt; echo '<<{nonce}>>'; cat {report}; "
            f"echo '<</{nonce}>>'"
        )
        shell = BashSession(isolation, rw_binds={SHOWN_AS: str(copy.path)})
        await shell.start()
        try:
            outcome = await shell.run(command, timeout_s)
        finally:
            await shell.close()
        text = outcome.output.data.decode("utf-8", errors="replace")
        everything = frozenset(test_ids)

        def failing(status: str, output: str) -> TestOutcome:
            ignored = tuple(changes.ignored)
            return TestOutcome(frozenset(), everything, status, outcome.elapsed_s, output, ignored)

        if outcome.status == "timeout":
            return failing("timeout", text)
        head, _, rest = text.partition(f"<<{nonce}>>")
        xml, found, _ = rest.partition(f"<</{nonce}>>")
        try:
            report_xml = xml.strip()
            passed, failed = _parse(report_xml, pristine) if found and report_xml else (None, None)
        except (ET.ParseError, OSError, ValueError):
            passed = failed = None
        if passed is None:
            return failing("no_report", head)
        if must_fail in passed or must_pass not in passed:
            return failing("tampered", head)
        passed &= everything
        missing = everything - passed - failed  # not collected (deleted, renamed): failed
        failed = (failed & everything) | missing
        return TestOutcome(
            frozenset(passed),
            frozenset(failed),
            "ok",
            outcome.elapsed_s,
            head[-2000:],
            tuple(changes.ignored),
        )
    finally:
        copy.close()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
