"""Hidden-test evaluation of an agent's working copy, in a fresh sandbox.

The agent never sees the hidden tests: they live in the task's pristine
repository in the task cache on the host (under a root every sandbox masks;
the agent's copy was made without them) and are written only into a
*second* copy of the agent's working copy, made for the evaluation, which a
new sandbox runs pytest in. The agent's copy itself is not touched.

Before the run, the test files the task names — hidden and visible — are
restored from the pristine repository (the agent may have edited or deleted
them), and so is every file that
configures pytest (``conftest.py`` anywhere, ``pytest.ini``, ``tox.ini``,
``setup.cfg``, ``pyproject.toml``): a ``conftest.py`` the agent added is
removed. The report is JUnit XML written outside the repository and read
back through the sandboxed shell, between markers drawn at random for this
run. The package code the tests import is the agent's and runs in the same
process as pytest, so a determined agent could still subvert the run from
inside; that is the limit of any in-process test harness (SWE-bench's
included), and the reason the evaluation runs sandboxed, with a deadline.
"""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vt_envs.domains.swe.test_runs import junit_node_id
from vt_envs.domains.swe.workspace import SHOWN_AS, Workspace
from vt_envs.sandbox.bash_session import BashSession
from vt_envs.sandbox.isolation import Isolation

__all__ = ["CONFIG_FILES", "TestOutcome", "run_hidden_tests"]

#: Files that configure pytest; restored from the base (or removed) before an evaluation.
CONFIG_FILES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")


@dataclass(frozen=True)
class TestOutcome:
    """What the hidden tests did on the agent's copy.

    Attributes:
        passed / failed: test ids (``tests/test_x.py::test_y``) by outcome
            (errors and skips count as failed: a test must pass).
        status: ``"ok"``, ``"timeout"`` or ``"no_report"`` (pytest wrote none).
        elapsed_s: wall time of the run.
        output: the tail of pytest's output (for ``info``, never for the agent).
    """

    passed: frozenset[str] = field(default_factory=frozenset)
    failed: frozenset[str] = field(default_factory=frozenset)
    status: str = "ok"
    elapsed_s: float = 0.0
    output: str = ""


def _restore(copy: Workspace, base: Path, test_files: Sequence[str]) -> None:
    """Reset the named test files and every pytest configuration file to the base's."""
    config = [
        e.path
        for e in copy.files.walk()
        if not e.is_dir and e.path.rsplit("/", 1)[-1] in CONFIG_FILES
    ]
    for rel in sorted({*config, *test_files}):
        source = base / rel
        # (A directory on the way the agent made a symlink raises PathError: no run.)
        if source.is_file() and not source.is_symlink():
            copy.files.write(rel, source.read_bytes(), create_parents=True)
        else:
            copy.files.remove(rel)


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
    """Run ``test_ids`` (from ``test_files``) on a copy of ``agent_copy``.

    ``pristine``: the task's repository before the agent, hidden tests
    included: the source of the restored test and configuration files.
    The interpreter is the sandbox's (``isolation.policy.python``); pytest
    must be importable by it. ``test_env``: variables for the run, the same
    the task was validated with (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``...).
    """
    python = isolation.policy.python
    copy = Workspace(agent_copy.path)
    try:
        _restore(copy, pristine, test_files)
        nonce = secrets.token_hex(8)
        report = f"/tmp/work/report-{nonce}.xml"
        ids = " ".join(_quote(t) for t in test_ids)
        variables = " ".join(f"{k}={_quote(v)}" for k, v in (test_env or {}).items())
        command = (
            f"cd {SHOWN_AS} && {variables} PYTHONDONTWRITEBYTECODE=1 {_quote(python)} -m pytest -q "
            "-p no:cacheprovider "
            f"--junitxml={report} -o junit_family=xunit1 {ids} > /tmp/work/out-{nonce}.txt 2>&1; "
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
        if outcome.status == "timeout":
            return TestOutcome(frozenset(), frozenset(test_ids), "timeout", outcome.elapsed_s, text)
        head, _, rest = text.partition(f"<<{nonce}>>")
        xml, found, _ = rest.partition(f"<</{nonce}>>")
        try:
            report_xml = xml.strip()
            passed, failed = _parse(report_xml, pristine) if found and report_xml else (None, None)
        except ET.ParseError:
            passed = failed = None
        if passed is None:
            return TestOutcome(
                frozenset(), frozenset(test_ids), "no_report", outcome.elapsed_s, head
            )
        missing = set(test_ids) - passed - failed  # not collected (deleted, renamed): failed
        return TestOutcome(
            frozenset(passed), frozenset(failed | missing), "ok", outcome.elapsed_s, head[-2000:]
        )
    finally:
        copy.close()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
