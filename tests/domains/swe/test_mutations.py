"""VT-SWE's mutation task builder: every kind proposed and confined to its span, pytest runs
reported by node id under a deadline, kept mutants caught by some tests and not others,
deduplicated, seeded, split by function, and issue texts that never show the bug."""

from __future__ import annotations

import ast
import shutil
import time
from pathlib import Path

import pytest

from vt_envs.domains.swe import mutants
from vt_envs.domains.swe.mutants import MutantTask, build_tasks, issue_text, split_tasks, validate
from vt_envs.domains.swe.mutations import MUTATION_KINDS, Mutation, candidate_mutations
from vt_envs.domains.swe.test_runs import TestReport, run_tests
from vt_envs.errors import InvalidConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "minipkg"
SOURCES = ["minipkg/mathutil.py", "minipkg/text.py"]
TESTS = ["tests/test_minipkg.py"]
# The fixture needs no pytest plugin; not loading this venv's (hypothesis, asyncio)
# makes each run ~0.2 s instead of ~1 s.
FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
ALL_IDS = {
    f"tests/test_minipkg.py::{name}"
    for name in [
        "test_clamp[-5-0]",
        "test_clamp[3-3]",
        "test_clamp[9-5]",
        "test_clamp_keeps_the_bounds",
        "test_running_max",
        "test_running_max_of_nothing",
        "test_window_sums",
        "test_format_price",
        "test_format_price_pads_the_cents",
        "TestTally::test_add_counts_case_insensitively",
        "TestTally::test_top",
    ]
}

SOURCE = '''\
"""A module docstring with 7 in it."""

import math  # a comment outside any function


def scale(x, factor=3):  # the default 3 is never mutated
    """A docstring with 7 in it."""
    # a comment inside
    total = 0
    for i in range(2):
        total += x * factor - i
    if total > 10:
        return total
    if x is None and factor:
        total = -1
    else:
        total = total // 2  # halve
    while total in (1, 2):
        total = total - 1
    return total < math.floor(x[:1])


class Label:
    def render(self, x):
        label = "Größe: " + str(x)
        return label
'''


def _copy_fixture(dest: Path) -> Path:
    # Never run anything in the fixture itself: its directory must stay pristine.
    return Path(shutil.copytree(FIXTURE, dest / "minipkg"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A copy of the fixture that the tests only read (build_tasks and validate copy it again)."""
    return _copy_fixture(tmp_path_factory.mktemp("swe"))


@pytest.fixture(scope="module")
def baseline(repo) -> TestReport:
    return run_tests(repo, TESTS, timeout_s=30, env=FAST)


@pytest.fixture(scope="module")
def built(repo) -> list[MutantTask]:
    return build_tasks(
        repo, source_paths=SOURCES, test_paths=TESTS, seed=0, max_tasks=6, timeout_s=30, env=FAST
    )


# --------------------------------------------------------------------------- candidates


def test_every_kind_is_proposed_and_each_mutant_compiles():
    found = candidate_mutations(SOURCE, "pkg/mod.py")
    assert {m.kind for m in found} == set(MUTATION_KINDS)
    for m in found:
        ast.parse(m.mutant_source)
        assert m.mutant_source != SOURCE and m.original != m.mutated
    assert len({m.id for m in found}) == len(found)  # ids tell every mutation apart
    assert [m.id for m in candidate_mutations(SOURCE, "pkg/mod.py")] == [m.id for m in found]
    order = [(m.lineno, m.col, MUTATION_KINDS.index(m.kind)) for m in found]
    assert order == sorted(order)


def _line_offset(source: str, lineno: int) -> int:
    return sum(len(line) for line in source.splitlines(keepends=True)[: lineno - 1])


def test_each_mutant_differs_from_the_source_only_at_the_mutated_span():
    for m in candidate_mutations(SOURCE, "pkg/mod.py"):
        line = SOURCE.splitlines(keepends=True)[m.lineno - 1]
        start = _line_offset(SOURCE, m.lineno) + len(line.encode()[: m.col].decode())
        assert SOURCE[start:].startswith(m.original), m
        if m.mutated:  # the node's span replaced, every other byte (comments too) kept
            expected = SOURCE[:start] + m.mutated + SOURCE[start + len(m.original) :]
        else:  # the statement's own lines deleted, nothing else
            end = start + len(m.original)
            expected = (
                SOURCE[: _line_offset(SOURCE, m.lineno)] + SOURCE[SOURCE.index("\n", end) + 1 :]
            )
        assert m.mutant_source == expected, m


def test_what_is_never_mutated_and_what_each_kind_makes():
    found = candidate_mutations(SOURCE, "pkg/mod.py")
    by_kind = {
        kind: {(m.original, m.mutated) for m in found if m.kind == kind} for kind in MUTATION_KINDS
    }
    assert all(m.lineno not in (1, 3, 6, 7) for m in found)  # docstrings, defaults, imports
    assert {m.function for m in found} == {"scale", "Label.render"}
    assert ("total > 10", "total <= 10") in by_kind["flip_comparison"]
    assert ("x is None", "x is not None") in by_kind["flip_comparison"]
    assert ("total in (1, 2)", "total not in (1, 2)") in by_kind["flip_comparison"]
    assert {("range(2)", "range(3)"), ("range(2)", "range(1)")} <= by_kind["off_by_one"]
    assert ("x[:1]", "x[:0]") in by_kind["off_by_one"]
    assert ("total > 10", "total > 11") in by_kind["off_by_one"]
    assert not [m for m in found if m.kind == "off_by_one" and m.original.startswith("total =")]
    assert ("x is None and factor", "x is None or factor") in by_kind["swap_operator"]
    assert ("total += x * factor - i", "total -= x * factor - i") in by_kind["swap_operator"]
    assert ("x * factor - i", "i - x * factor") in by_kind["swap_operands"]
    assert ('"Größe: " + str(x)', 'str(x) + "Größe: "') in by_kind["swap_operands"]
    assert ("total > 10", "10 > total") in by_kind["swap_operands"]
    assert not any(mutated.startswith("not (x") for _, mutated in by_kind["flip_if_else"])
    assert ("total > 10", "not (total > 10)") in by_kind["flip_if_else"]
    swapped = next(m for m in found if m.kind == "flip_if_else" and m.original.startswith("if x"))
    # Whole lines move; the comment after the if statement's end stays where it was.
    assert swapped.mutated == (
        "if x is None and factor:\n        total = total // 2\n    else:\n        total = -1"
    )
    assert "        total = -1  # halve\n" in swapped.mutant_source
    assert ("return total", "pass") in by_kind["remove_return"]  # the only one: not the last
    assert len(by_kind["remove_return"]) == 1
    assert {m.original.split(":")[0] for m in found if m.kind == "remove_loop"} == {
        "for i in range(2)",
        "while total in (1, 2)",
    }
    assert ("total = 0", "") in by_kind["remove_assignment"]
    assert ("total = -1", "pass") in by_kind["remove_assignment"]  # its block would be empty


def test_a_mutant_equal_to_the_source_or_that_does_not_compile_is_never_proposed():
    source = "def f(a, items):\n    for x in items:\n        if x:\n            break\n"
    source += "    return a - a\n"
    found = candidate_mutations(source, "m.py")
    assert not [m for m in found if m.kind == "swap_operands"]  # a - a swapped is a - a
    for m in found:
        compile(m.mutant_source, "m.py", "exec")
    with pytest.raises(InvalidConfigError, match="does not parse"):
        candidate_mutations("def f(:\n", "broken.py")


# --------------------------------------------------------------------------- test runs


def test_run_tests_reports_every_test_by_node_id(baseline, repo):
    assert baseline.passed == ALL_IDS
    assert not baseline.failed and not baseline.errors and not baseline.timed_out
    assert not list(repo.rglob("__pycache__")) and not list(repo.rglob(".pytest_cache"))


def test_the_ids_are_accepted_by_pytest_one_at_a_time(repo, monkeypatch):
    # The caller's pytest settings must not leak into the run (this option would break it).
    monkeypatch.setenv("PYTEST_ADDOPTS", "--no-such-option")
    plain, param, method = (
        "tests/test_minipkg.py::test_running_max",
        "tests/test_minipkg.py::test_clamp[-5-0]",
        "tests/test_minipkg.py::TestTally::test_top",
    )
    for test_id in (plain, param, method):
        report = run_tests(repo, [test_id], timeout_s=30, env=FAST)
        assert report.passed == {test_id}, report.output_tail


def test_failures_and_import_errors_are_reported_with_their_messages(tmp_path):
    copy = _copy_fixture(tmp_path)
    text = copy / "minipkg" / "text.py"
    text.write_text(text.read_text().replace("cents // 100", "cents // 10"))
    (copy / "tests" / "test_broken.py").write_text("import no_such_module\n")
    (copy / "tests" / "sub.d").mkdir()  # a dot in a directory, and in a parameter
    dotted = "import pytest\n\n@pytest.mark.parametrize('v', ['a.b'])\ndef test_v(v):\n    pass\n"
    (copy / "tests" / "sub.d" / "test_dotted.py").write_text(dotted)
    paths = [*TESTS, "tests/test_broken.py", "tests/sub.d"]
    report = run_tests(copy, paths, timeout_s=30, env=FAST)
    price = {
        "tests/test_minipkg.py::test_format_price",
        "tests/test_minipkg.py::test_format_price_pads_the_cents",
    }
    assert report.failed == price
    assert report.errors == {"tests/test_broken.py"}
    dotted_id = "tests/sub.d/test_dotted.py::test_v[a.b]"
    assert report.passed == ALL_IDS - price | {dotted_id}
    assert run_tests(copy, [dotted_id], timeout_s=30, env=FAST).passed == {dotted_id}
    assert report.messages["tests/test_minipkg.py::test_format_price"].startswith("AssertionError")


SLEEPER = """\
import os, subprocess, sys, time

def test_sleeps(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(os.environ["PID_FILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


def test_the_deadline_kills_the_whole_process_group(tmp_path):
    copy = _copy_fixture(tmp_path)
    (copy / "tests" / "test_sleep.py").write_text(SLEEPER)
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    report = run_tests(
        copy, ["tests/test_sleep.py"], timeout_s=2, env={**FAST, "PID_FILE": str(pid_file)}
    )
    assert report.timed_out and not report.passed and not report.failed
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), "the test's child survived the deadline"


def test_bad_arguments_are_typed_errors(repo, baseline):
    with pytest.raises(InvalidConfigError, match="test_paths"):
        run_tests(repo, [], timeout_s=5)
    with pytest.raises(InvalidConfigError, match="timeout_s"):
        run_tests(repo, TESTS, timeout_s=0)
    with pytest.raises(InvalidConfigError, match="cannot start"):
        run_tests(repo, TESTS, timeout_s=5, python="/no/such/python")
    dirty = TestReport(baseline.passed, frozenset({"tests/t.py::x"}), frozenset(), False, 0.0, "")
    some = candidate_mutations((repo / SOURCES[0]).read_text(), SOURCES[0])[0]
    with pytest.raises(InvalidConfigError, match="baseline"):
        validate(repo, some, TESTS, baseline=dirty, timeout_s=5)
    with pytest.raises(InvalidConfigError, match="max_tasks"):
        build_tasks(repo, source_paths=SOURCES, test_paths=TESTS, seed=0, max_tasks=0, timeout_s=5)
    with pytest.raises(InvalidConfigError, match=r"nope\.py"):
        build_tasks(repo, source_paths=["nope.py"], test_paths=TESTS, seed=0, timeout_s=5)


# --------------------------------------------------------------------------- tasks


def test_kept_mutants_break_some_tests_and_not_others(built, baseline):
    assert len(built) == 6
    for task in built:
        assert task.fail_to_pass and task.pass_to_pass
        assert not set(task.fail_to_pass) & set(task.pass_to_pass)
        assert set(task.fail_to_pass) | set(task.pass_to_pass) == baseline.passed
        assert task.test_files == tuple(TESTS)
    assert len({task.mutation.mutant_source for task in built}) == len(built)


def test_fail_to_pass_fail_and_pass_to_pass_pass_on_the_mutant(built, tmp_path):
    task = built[0]
    copy = _copy_fixture(tmp_path)
    (copy / task.mutation.path).write_text(task.mutation.mutant_source)
    report = run_tests(copy, TESTS, timeout_s=30, env=FAST)
    assert report.passed == set(task.pass_to_pass)
    assert set(task.fail_to_pass) <= report.failed | report.errors


def test_a_mutant_of_the_function_no_test_covers_is_rejected(repo, baseline):
    path = "minipkg/mathutil.py"
    uncovered = [
        m for m in candidate_mutations((repo / path).read_text(), path) if m.function == "mean_gap"
    ]
    flip = next(m for m in uncovered if m.kind == "flip_comparison")
    assert validate(repo, flip, TESTS, baseline=baseline, timeout_s=30, env=FAST) is None


def test_the_same_seed_gives_the_same_tasks_whatever_the_order_of_the_paths(built, repo):
    again = build_tasks(
        repo,
        source_paths=["minipkg/text.py", "minipkg"],  # other order, a directory, overlapping
        test_paths=TESTS,
        seed=0,
        max_tasks=6,
        timeout_s=30,
        env=FAST,
    )
    assert again == built


def test_duplicate_and_no_op_mutants_are_never_run(repo, baseline, monkeypatch):
    source = (repo / SOURCES[0]).read_text()
    clamp = [m for m in candidate_mutations(source, SOURCES[0]) if m.function == "clamp"]
    no_op = Mutation(SOURCES[0], "clamp", "swap_operands", 6, 7, "a", "a", source)
    twice = [no_op, *clamp, *(Mutation(**{**vars(m), "lineno": m.lineno + 100}) for m in clamp)]
    monkeypatch.setattr(
        mutants,
        "candidate_mutations",
        lambda text, path: list(twice) if path == SOURCES[0] else [],
    )
    runs = []
    real_validate = mutants.validate

    def counting(repo, mutation, *args, **kwargs):
        runs.append(mutation.mutant_source)
        return real_validate(repo, mutation, *args, **kwargs)

    monkeypatch.setattr(mutants, "validate", counting)
    tasks = build_tasks(
        repo, source_paths=SOURCES, test_paths=TESTS, seed=3, timeout_s=30, env=FAST
    )
    assert len(runs) == len(set(runs)) == len(clamp)  # each distinct mutant once, no no-op
    assert source not in runs
    assert len({t.mutation.mutant_source for t in tasks}) == len(tasks) >= 1


def _synthetic_tasks() -> list[MutantTask]:
    found = []
    for path in SOURCES:
        found += candidate_mutations((FIXTURE / path).read_text(), path)
    return [MutantTask(m, ("t::f",), ("t::p",), tuple(TESTS), "") for m in found]


def test_split_holds_out_whole_functions_deterministically(built):
    tasks = _synthetic_tasks()
    train, test = split_tasks(tasks, 0.25, seed=0)
    key = lambda t: (t.mutation.path, t.mutation.function)  # noqa: E731
    functions = {key(t) for t in tasks}
    assert {key(t) for t in train}.isdisjoint({key(t) for t in test})
    assert sorted(map(id, train + test)) == sorted(map(id, tasks))
    assert len({key(t) for t in test}) == round(0.25 * len(functions))
    assert split_tasks(tasks, 0.25, seed=0) == (train, test)
    assert [key(t) for t in split_tasks(tasks, 0.25, seed=1)[1]] != [key(t) for t in test]
    assert train == [t for t in tasks if t in train]  # each split keeps the input order
    small_train, small_test = split_tasks(built, 0.2, seed=0)
    assert small_train and small_test
    with pytest.raises(InvalidConfigError, match="test_fraction"):
        split_tasks(tasks, 1.0, seed=0)


# --------------------------------------------------------------------------- issue text


def _assert_hides_the_bug(text: str, m: Mutation) -> None:
    if m.mutated:
        assert m.mutated not in text
    for line in m.original.splitlines():
        assert line.strip() not in text
    assert f"{m.path}:{m.lineno}" not in text and f"line {m.lineno}" not in text


def _assert_names_no_test(text: str, task: MutantTask) -> None:
    # The ids would tell code planted in the package which outcomes to rewrite while
    # grading (issue 28); a bug report says what goes wrong, not which test checks it.
    for test_id in (*task.fail_to_pass, *task.pass_to_pass):
        assert test_id not in text and test_id.split("::")[-1].split("[")[0] not in text


def test_issue_texts_describe_the_failure_but_name_no_test_and_never_show_the_bug(built):
    for task in built:
        _assert_hides_the_bug(task.issue_text, task.mutation)
        _assert_names_no_test(task.issue_text, task)
        assert "`minipkg`" in task.issue_text and "fails with:" in task.issue_text


def _clamp_task(kind: str) -> MutantTask:
    source = (FIXTURE / SOURCES[0]).read_text()
    m = next(m for m in candidate_mutations(source, SOURCES[0]) if m.kind == kind)
    failing = ("tests/test_minipkg.py::test_clamp[-5-0]",)
    return MutantTask(m, failing, ("tests/test_minipkg.py::test_top",), tuple(TESTS), "")


def test_issue_text_states_the_wrong_result_from_the_assertion():
    task = _clamp_task("flip_comparison")
    message = "assert -5 == 0\n +  where -5 = clamp(-5, 0, 5)"
    report = TestReport(
        frozenset(),
        frozenset(task.fail_to_pass),
        frozenset(),
        False,
        1.0,
        "",
        {task.fail_to_pass[0]: message},
    )
    text = issue_text(task, report)
    assert "Calling `clamp(-5, 0, 5)` returns -5, but 0 is expected." in text
    assert "assert -5 == 0" in text
    _assert_hides_the_bug(text, task.mutation)
    _assert_names_no_test(text, task)


def test_issue_text_drops_whatever_would_reveal_the_bug():
    task = _clamp_task("flip_comparison")
    m = task.mutation
    leaky = f"assert 1 == 2\nin {m.mutated}\n{m.path}:{m.lineno}: AssertionError\n{m.original}"
    tail = f"E   {m.mutated}\n{m.path}:{m.lineno}: AssertionError\n"
    for messages in ({task.fail_to_pass[0]: leaky}, {}):  # JUnit's message, or the E lines
        report = TestReport(
            frozenset(), frozenset(task.fail_to_pass), frozenset(), False, 1.0, tail, messages
        )
        text = issue_text(task, report)
        _assert_hides_the_bug(text, m)
        _assert_names_no_test(text, task)


def test_the_fixture_directory_stays_clean():
    leftovers = [p for p in FIXTURE.rglob("*") if p.name in ("__pycache__", ".pytest_cache")]
    assert leftovers == []


def test_the_held_out_functions_span_the_files():
    """Issue 31: vtutils' held-out split was 17 of 21 tasks from two functions of one file.
    Held-out functions are now drawn from each file in turn."""
    tasks = _synthetic_tasks()
    files = {t.mutation.path for t in tasks}
    for seed in range(5):
        _, test = split_tasks(tasks, 0.25, seed=seed)
        assert {t.mutation.path for t in test} == files, seed


def test_max_per_function_caps_the_mutants_of_one_function():
    tasks = build_tasks(
        FIXTURE, source_paths=SOURCES, test_paths=TESTS, seed=0, max_per_function=1,
        timeout_s=30, env=FAST,
    )  # fmt: skip
    functions = [(t.mutation.path, t.mutation.function) for t in tasks]
    assert len(tasks) >= 2 and len(functions) == len(set(functions))


def test_narrowed_validation_runs_only_the_covering_test_modules(tmp_path):
    repo = tmp_path / "minipkg"
    shutil.copytree(FIXTURE, repo)
    (repo / "tests" / "test_text.py").write_text(
        "from minipkg.text import *  # names the module: it covers text.py\n\n"
        "def test_nothing():\n    assert True\n"
    )
    tests = ["tests/test_minipkg.py", "tests/test_text.py"]
    assert mutants.covering_tests(repo, "minipkg/text.py", tests) == tests
    assert mutants.covering_tests(repo, "minipkg/mathutil.py", tests) == [tests[0]]
    assert mutants.covering_tests(repo, "minipkg/__init__.py", tests) == tests
    # A package's __init__.py: by the function's (or its class's) name.
    assert mutants.covering_tests(repo, "minipkg/__init__.py", tests, "clamp") == [tests[0]]
    assert mutants.covering_tests(repo, "minipkg/__init__.py", tests, "X.__eq__") == tests
    tasks = build_tasks(
        repo, source_paths=["minipkg/mathutil.py"], test_paths=tests, seed=0, max_tasks=2,
        narrow_tests=True, timeout_s=30, env=FAST,
    )  # fmt: skip
    assert tasks and all(t.test_files == (tests[0],) for t in tasks)
    assert all(p.startswith("tests/test_minipkg.py::") for t in tasks for p in t.pass_to_pass)


def test_max_runs_bounds_the_mutant_test_runs(monkeypatch):
    runs = []
    real_validate = mutants.validate
    counting = lambda *a, **k: runs.append(1) or real_validate(*a, **k)  # noqa: E731
    monkeypatch.setattr(mutants, "validate", counting)
    build_tasks(FIXTURE, source_paths=SOURCES, test_paths=TESTS, seed=0, max_runs=3,
                timeout_s=30, env=FAST)  # fmt: skip
    assert len(runs) == 3
