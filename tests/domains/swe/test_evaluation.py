"""Hidden-test evaluation: run in a fresh sandbox on a copy, test and pytest-config files
restored from the pristine repository, a deadline, results read back from JUnit XML."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from vt_envs.domains.swe.evaluation import run_hidden_tests
from vt_envs.domains.swe.workspace import Workspace
from vt_envs.sandbox.isolation import resolve_isolation
from vt_envs.sandbox.policy import SandboxPolicy

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef double(x):\n    return 2 * x\n"
FIXED = BUGGY.replace("a - b", "a + b")
HIDDEN = (
    "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "class TestAdd:\n    def test_zero(self):\n        assert add(0, 7) == 7\n"
)
VISIBLE = "from calc import double\n\n\ndef test_double():\n    assert double(4) == 8\n"
IDS = [
    "tests/test_hidden.py::test_add",
    "tests/test_hidden.py::TestAdd::test_zero",
    "tests/test_visible.py::test_double",
]
FILES = ["tests/test_hidden.py", "tests/test_visible.py"]


@pytest.fixture
def repos(tmp_path):
    pristine = tmp_path / "pristine"
    (pristine / "tests").mkdir(parents=True)
    (pristine / "calc.py").write_text(BUGGY)
    (pristine / "tests" / "test_hidden.py").write_text(HIDDEN)
    (pristine / "tests" / "test_visible.py").write_text(VISIBLE)
    given = tmp_path / "given"  # what the agent gets: the hidden tests left out
    shutil.copytree(pristine, given)
    (given / "tests" / "test_hidden.py").unlink()
    return pristine, given


def _evaluate(copy, pristine, timeout_s=60.0):
    isolation = resolve_isolation(SandboxPolicy())
    return asyncio.run(
        run_hidden_tests(copy, pristine=pristine, test_ids=IDS, test_files=FILES,
                         isolation=isolation, timeout_s=timeout_s)
    )  # fmt: skip


def test_a_fix_passes_and_the_bug_fails_while_the_agent_copy_is_untouched(repos):
    pristine, given = repos
    copy = Workspace(given)
    try:
        before = _evaluate(copy, pristine)
        assert before.status == "ok"
        assert before.failed == {IDS[0], IDS[1]} and before.passed == {IDS[2]}
        (copy.path / "calc.py").write_text(FIXED)
        after = _evaluate(copy, pristine)
        assert after.passed == set(IDS) and not after.failed
        assert not (copy.path / "tests" / "test_hidden.py").exists()  # never shown
    finally:
        copy.close()


def test_tampering_with_tests_or_pytest_config_does_not_pass_the_bug(repos):
    pristine, given = repos
    copy = Workspace(given)
    try:
        (copy.path / "tests" / "test_hidden.py").write_text("def test_add():\n    pass\n")
        (copy.path / "tests" / "test_visible.py").unlink()
        (copy.path / "conftest.py").write_text(
            "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
        )
        (copy.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:python\n")
        outcome = _evaluate(copy, pristine)
        assert outcome.status == "ok"
        assert outcome.failed == {IDS[0], IDS[1]} and outcome.passed == {IDS[2]}
    finally:
        copy.close()


def test_a_hanging_package_times_out_and_fails_every_test(repos):
    pristine, given = repos
    copy = Workspace(given)
    try:
        (copy.path / "calc.py").write_text("import time\ntime.sleep(1000)\n" + FIXED)
        outcome = _evaluate(copy, pristine, timeout_s=3.0)
        assert outcome.status == "timeout" and outcome.failed == set(IDS) and not outcome.passed
    finally:
        copy.close()


def test_the_grading_copy_has_the_agents_bounds_not_the_defaults(repos):
    """A repository past the default 20,000 entries, with max_files raised for it: its
    grading copy (the pristine tree plus the change) must fit, or a fix would score 0."""
    from vt_envs.domains.swe.workspace import MAX_FILES

    pristine, given = repos
    for tree in (pristine, given):
        data = tree / "data"
        data.mkdir()
        for i in range(MAX_FILES + 500):
            (data / f"{i}.txt").touch()
    copy = Workspace(given, max_files=MAX_FILES + 5_000)
    try:
        (copy.path / "calc.py").write_text(FIXED)
        outcome = _evaluate(copy, pristine)
        assert outcome.status == "ok" and outcome.passed == set(IDS), outcome.output[-500:]
    finally:
        copy.close()
