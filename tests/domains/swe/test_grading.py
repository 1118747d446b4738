"""VT-SWE-v0 grading that only a fix can pass (issue 28, red-team findings), through
``gym.make("VT-SWE-v0").step`` with the bug left unfixed: code planted in the package
that rewrites the run's outcomes from inside pytest, a run that exits 0 early, a forged
or flooded report, outcomes flipped for the tests the agent knows by name; hidden tests
nowhere the agent's shell can read; and the parts that make it so (the runner's report
parsing, the canaries, the JUnit reader used at build time) on their own."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.domains.swe.canaries import Canary, judge, plant
from vt_envs.domains.swe.grading_runner import outcome_letter, parse_reports
from vt_envs.domains.swe.sources import BUILTIN_REPO
from vt_envs.domains.swe.test_runs import junit_node_id, run_tests
from vt_envs.errors import InvalidConfigError

# --------------------------------------------------------------------------- attacks

# Every report pytest makes marked passed (its TestReport constructor patched).
FLIP_EVERY_REPORT = """
import sys as _s
if "_pytest.reports" in _s.modules:
    _R = _s.modules["_pytest.reports"].TestReport
    _f = _R.from_item_and_call.__func__
    def _g(cls, item, call):
        rep = _f(cls, item, call)
        if SPARE not in item.nodeid:
            rep.outcome = "passed"; rep.longrepr = None
        return rep
    _R.from_item_and_call = classmethod(_g)
"""
# A pytest hook registered from the package: every call phase passed.
HOOK_MAKEREPORT = """
import gc as _gc, sys as _s
if "pytest" in _s.modules:
    import pytest as _pt
    class _Pass:
        @_pt.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            if "vt_canary" not in item.nodeid:  # (the old canaries' module)
                outcome.get_result().outcome = "passed"
    for _o in _gc.get_objects():
        if type(_o).__name__ == "PytestPluginManager":
            _o.register(_Pass())
            break
"""
# The red team's: the JUnit report rewritten at exit, failures dropped (PATHOLOGICAL: and
# a test case whose classname has 24 parts; the old reader took seconds per part).
REWRITE_JUNIT_AT_EXIT = """
import sys as _s, atexit as _a
_j = [a.split("=", 1)[1] for a in _s.argv if a.startswith("--junitxml=")]
def _fix():
    import xml.etree.ElementTree as E
    if not _j:
        return
    t = E.parse(_j[0])
    for c in t.getroot().iter("testcase"):
        if "must_fail" not in c.get("name", ""):
            for ch in list(c):
                if ch.tag in ("failure", "error", "skipped"):
                    c.remove(ch)
    if PATHOLOGICAL:
        for s in t.getroot().iter("testsuite"):
            E.SubElement(s, "testcase", classname="." * 23, name="x")
    t.write(_j[0])
_a.register(_fix)
"""
EXIT_0 = """
import os as _o, sys as _s
if "_pytest" in _s.modules:
    _o._exit(0)
"""
# Knows the runner's protocol: takes its report fd and token from the command line and
# reports every id on it passed, then exits 1 before pytest can report anything.
FORGE_RUNNER_REPORTS = """
import json as _j, os as _o, sys as _s
if "_pytest" in _s.modules:
    _a = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
    _i = _a.index("-c")
    _fd, _tok = int(_a[_i + 2]), _a[_i + 3]
    for _t in [x for x in _a if "::" in x]:
        for _w in ("setup", "call", "teardown"):
            _o.write(_fd, (_tok + " " + _j.dumps([_t, _w, "passed"]) + "\\n").encode())
    _o._exit(1)
"""
# The tests the agent knows by name (here: told them outright) flipped to passed.
FLIP_NAMED = """
import sys as _s
_NAMES = @IDS@
if "_pytest.reports" in _s.modules:
    _R = _s.modules["_pytest.reports"].TestReport
    _f = _R.from_item_and_call.__func__
    def _g(cls, item, call):
        rep = _f(cls, item, call)
        if item.nodeid in _NAMES:
            rep.outcome = "passed"; rep.longrepr = None
        return rep
    _R.from_item_and_call = classmethod(_g)
"""
# 64 MiB of report lines whose node ids have 22 dotted / slashed parts, then exit 1.
FLOOD_REPORTS = """
import os as _o, sys as _s
if "_pytest" in _s.modules:
    _a = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
    _fd = int(_a[_a.index("-c") + 2])
    _line = ("x " + ".".join(["tests/a"] * 22) + "\\n").encode() * 4096
    for _ in range((64 << 20) // len(_line)):
        _o.write(_fd, _line)
    _o._exit(1)
"""


def _bash(command: str) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "bash", "arguments": {"command": command}})
        + ("</tool_call>")
    )


def _append_to_package(code: str) -> str:
    return _bash(f"cat >> vtutils/__init__.py <<'VT_EOF'\n{code}\nVT_EOF")


def _episode(actions, *, seed=0, **kwargs):
    """The actions, then ``<submit>``, on VT-SWE-v0's held-out task ``seed`` (its bug
    unfixed); ``(reward, info, observations, submit step seconds, task)``."""
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", **kwargs)
    try:
        obs, _ = env.reset(seed=seed)
        task = env.unwrapped.task
        observations = [obs["text"]]
        for action in [*actions, "<submit>done</submit>"]:
            started = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            elapsed = time.perf_counter() - started
            observations.append(obs["text"])
            if terminated or truncated:
                break
    finally:
        env.close()
    return reward, info, observations, elapsed, task


def _task_ids(seed=0) -> tuple[list[str], list[str]]:
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test")
    env.reset(seed=seed)
    assets = env.unwrapped.task.assets
    env.close()
    return list(assets["fail_to_pass"]), list(assets["pass_to_pass"])


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize(
    "code",
    [
        FLIP_EVERY_REPORT.replace("SPARE", "'\\0'"),
        # Spares the names the old canaries had: the new ones are named like real tests.
        FLIP_EVERY_REPORT.replace("SPARE", "'must_fail'"),
        HOOK_MAKEREPORT,
    ],
    ids=["flip-every-report", "flip-sparing-old-canary-names", "makereport-hook"],
)
def test_rewriting_outcomes_from_inside_the_package_is_caught(code):
    reward, info, _, _, _ = _episode([_append_to_package(code)])
    parts = info["verifier_parts"]
    assert reward == 0.0 and parts["tampered"] == 1.0, parts
    assert parts["canaries"] >= 2


def test_a_report_rewritten_at_exit_earns_nothing():
    # Nothing reads a report file: the verdict comes over the runner's own pipes.
    code = REWRITE_JUNIT_AT_EXIT.replace("PATHOLOGICAL", "False")
    reward, info, _, _, _ = _episode([_append_to_package(code)])
    assert reward == 0.0 and info["verifier_parts"]["fail_to_pass_fixed"] == 0.0


def test_a_report_with_a_24_part_classname_ends_far_under_the_deadline_and_scores_nothing():
    code = REWRITE_JUNIT_AT_EXIT.replace("PATHOLOGICAL", "True")
    reward, info, _, elapsed, _ = _episode([_append_to_package(code)], eval_timeout_s=20)
    assert reward == 0.0
    # The verify deadline is 20 + 30 s; the old reader blocked the event loop past it
    # (22 parts: 14 s here, 55 s on the red team's machine; each part doubles it).
    assert elapsed < 10


def test_forging_the_runners_report_lines_is_caught():
    reward, info, _, _, _ = _episode([_append_to_package(FORGE_RUNNER_REPORTS)])
    assert reward == 0.0 and info["verifier_parts"]["tampered"] == 1.0


def test_exiting_0_before_any_test_ran_is_caught():
    reward, info, _, _, _ = _episode([_append_to_package(EXIT_0)])
    assert reward == 0.0 and info["verifier_parts"]["tampered"] == 1.0


def test_the_issue_text_names_no_test_and_flipping_the_named_ones_is_caught():
    fail_to_pass, pass_to_pass = _task_ids()
    code = FLIP_NAMED.replace("@IDS@", repr(set(fail_to_pass)))
    reward, info, observations, _, _ = _episode([_append_to_package(code)])
    prompt = observations[0]
    for test_id in (*fail_to_pass, *pass_to_pass):
        assert test_id not in prompt
        assert test_id.split("::")[-1].split("[")[0] not in prompt
    # Even told the FAIL_TO_PASS ids, flipping exactly those leaves their twins behind.
    assert reward == 0.0 and info["verifier_parts"]["tampered"] == 1.0, info["verifier_parts"]


def test_a_flood_of_pathological_reports_ends_far_under_the_deadline_and_scores_nothing():
    reward, info, _, elapsed, _ = _episode([_append_to_package(FLOOD_REPORTS)], eval_timeout_s=20)
    assert reward == 0.0 and info["verifier_parts"]["tampered"] == 1.0
    assert elapsed < 15  # the verify deadline is 20 + 30 s; the red team's took 55 s


def test_eval_children_splits_the_run_and_the_oracle_fix_still_scores():
    with pytest.raises(InvalidConfigError, match="eval_children"):
        gym.make("VT-SWE-v0", repos=["vtutils"], eval_children=0)
    for children in (1, 3):
        env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", eval_children=children)
        result = vt_envs.run_episode(env, vt_envs.oracle_for("VT-SWE-v0"), seed=1)
        env.close()
        parts = result.infos[-1]["verifier_parts"]
        assert result.reward == 1.0 and parts["tampered"] == 0.0
        # (fewer children than asked only where a batch would hold no real test)
        assert 1 <= parts["children"] <= children and parts["canaries"] >= parts["children"]


# --------------------------------------------------------------------------- hidden tests

_UNIQUE = "def test_median_odd_and_even"  # a line only the hidden tests hold
_LOOK = (
    "find / -xdev \\( -path /proc -o -path /sys \\) -prune -o -type f -path '*vtutils*' "
    "-name 'test_*.py' -print 2>/dev/null | head -5; "
    f"grep -rls --include='*.py' '{_UNIQUE}' /work /opt /srv /var /mnt /usr/local /etc "
    "2>/dev/null | head -5; "
    "git -C {checkout} show HEAD:vt_envs/assets/swe/vtutils/tests/test_stats.py 2>&1 | head -3; "
    "ls {copy} 2>&1 | head -3; echo LOOKED"
)


def test_hidden_tests_are_nowhere_the_agents_shell_can_read():
    checkout = BUILTIN_REPO.parents[3]  # the project checkout (or site-packages) holding it
    # Another copy outside every root the sandbox masks (a second clone, an unpacked sdist).
    copy = Path(tempfile.mkdtemp(prefix="vt-other-checkout-", dir="/var/tmp"))
    copy.chmod(0o755)  # readable by all, as a clone is
    try:
        shutil.copytree(BUILTIN_REPO, copy / "vtutils")
        command = _LOOK.format(checkout=checkout, copy=copy / "vtutils" / "tests")
        _, _, observations, _, _ = _episode([_bash(command)])
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    seen = observations[1]
    assert "LOOKED" in seen and "Permission denied" not in seen, seen
    assert "vtutils/tests/test_" not in seen and "test_stats.py\n" not in seen, seen
    assert "from vtutils" not in seen and "import pytest" not in seen, seen


def test_a_copy_of_the_assets_on_the_interpreters_path_is_hidden(tmp_path):
    # An interpreter whose sys.path holds another vt_envs (a non-editable install).
    venv = tmp_path / "venv"
    done = __import__("subprocess").run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"no venv here: {done.stderr[-300:]!r}")
    installed = Path(tempfile.mkdtemp(prefix="vt-installed-", dir="/var/tmp"))
    installed.chmod(0o755)  # readable by all, as an installation is
    try:
        shutil.copytree(BUILTIN_REPO.parent, installed / "vt_envs" / "assets" / "swe")
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "other-vt.pth").write_text(f"{installed}\n")
        from vt_envs.sandbox.policy import SandboxPolicy

        policy = SandboxPolicy(python=str(venv / "bin" / "python"))
        probe = f"python -c 'import sys; print(sys.path)'; ls -R {installed} | head -20"
        _, _, observations, _, _ = _episode([_bash(probe)], policy=policy)
    finally:
        shutil.rmtree(installed, ignore_errors=True)
    seen = observations[1]
    assert f"{installed}/vt_envs/assets/swe:" in seen, seen  # on its path and shown ...
    assert "test_stats.py" not in seen and "vtutils" not in seen, seen  # ... but empty


# --------------------------------------------------------------------------- the parts


def test_junit_node_ids_take_linear_time_however_many_parts():
    repo = BUILTIN_REPO
    for classname in ("." * 21, "/".join(["tests"] * 22), ".".join([".."] * 22), "." * 20000):
        started = time.perf_counter()
        junit_node_id(classname, "x", repo)
        assert time.perf_counter() - started < 0.5  # 22 parts took 55 s (exponential)
    assert junit_node_id("tests.test_stats", "test_mean", repo) == "tests/test_stats.py::test_mean"
    assert junit_node_id("tests.test_stats.TestK", "t[a.b]", repo) == (
        "tests/test_stats.py::TestK::t[a.b]"
    )


def test_report_parsing_refuses_what_no_pytest_writes():
    token, ids = "tok", {"t.py::a", "t.py::b"}

    def line(*fields):
        return f"{token} {json.dumps(list(fields))}\n".encode()

    good = b"".join(line("t.py::a", w, "passed") for w in ("setup", "call", "teardown"))
    phases, problems = parse_reports(good + line("t.py::b", "setup", "passed"), token, ids)
    assert problems == [] and outcome_letter(phases["t.py::a"]) == "P"
    assert outcome_letter(phases["t.py::b"]) == "M"  # never finished
    _, problems = parse_reports(good + b"other " + b"x" * 100 + b"\n", token, ids)
    assert problems == ["malformed"]
    _, problems = parse_reports(good + line("t.py::a", "call", "failed"), token, ids)
    assert problems == ["duplicate"]
    phases, problems = parse_reports(good + line("t.py::zz", "call", "passed"), token, ids)
    assert problems == [] and "t.py::zz" not in phases  # not this child's: dropped
    phases, _ = parse_reports(good + b'tok ["t.py::b", "set', token, ids)  # died mid-line
    assert "t.py::b" not in phases
    skipped = {"setup": "skipped", "teardown": "passed"}
    assert outcome_letter(skipped) == "F" and outcome_letter({}) == "M"
    # subTest reports (pytest 9: cachetools' tests) repeat their test's id: not duplicates,
    # and one that failed fails the test.
    subtests = line("t.py::a", "subtest", "passed") * 3
    phases, problems = parse_reports(good + subtests, token, ids)
    assert problems == [] and outcome_letter(phases["t.py::a"]) == "P"
    phases, problems = parse_reports(good + line("t.py::a", "subtest", "failed"), token, ids)
    assert problems == [] and outcome_letter(phases["t.py::a"]) == "F"


def test_judge_flags_each_kind_of_tampering():
    canaries = [Canary("m::c1", "fails", "m::a"), Canary("m::c2", "twin", "m::a")]
    batches = [["m::a", "m::c1"], ["m::b", "m::c2"]]

    def verdicts(first, second, exit_codes=(1, 1)):
        return [
            {"outcomes": first, "exit": exit_codes[0], "problems": []},
            {"outcomes": second, "exit": exit_codes[1], "problems": []},
        ]

    letters, tampered, incomplete = judge(batches, verdicts("PF", "PP"), canaries)
    assert letters == {"m::a": "P", "m::b": "P"} and not tampered and incomplete == 0
    assert judge(batches, verdicts("PP", "PP"), canaries)[1]  # a must-fail passed
    assert judge(batches, verdicts("PF", "PF"), canaries)[1]  # the twin disagreed
    assert judge(batches, verdicts("FF", "PF", (0, 1)), canaries)[1]  # exited 0
    # No canary could be planted (cachetools' tests are inherited from a mixin): every
    # test passing, the child exits 0, and that is not tampering.
    assert judge([["m::a", "m::b"]], [{"outcomes": "PP", "exit": 0, "problems": []}], []) == (
        {"m::a": "P", "m::b": "P"},
        [],
        0,
    )
    letters, tampered, incomplete = judge(batches, verdicts("PM", "PP"), canaries)
    assert not tampered and incomplete == 1 and letters["m::a"] == "M"


_FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@pytest.mark.parametrize(
    "module", sorted(p.name for p in (BUILTIN_REPO / "tests").glob("test_*.py"))
)
def test_canaries_behave_as_planted_on_the_clean_repository(module, tmp_path):
    # On a correct tree (what an honest fix makes) every must-fail clone fails and every
    # twin passes with its original: an honest fix is never taken for tampering.
    rel = f"tests/{module}"
    copy = tmp_path / "repo"
    shutil.copytree(BUILTIN_REPO, copy, ignore=shutil.ignore_patterns("__pycache__"))
    ids = sorted(run_tests(copy, [rel], timeout_s=60, env=_FAST).passed)
    text = (BUILTIN_REPO / rel).read_text()
    for seed in range(6):
        planted = plant({rel: text}, ids, fail_to_pass=ids[:2], n_fails=4, n_twins=3,
                        rng=random.Random(seed))  # fmt: skip
        assert len(planted.canaries) == 7
        names = {c.test_id.split("::")[-1].split("[")[0] for c in planted.canaries}
        assert not any(f"def {n}(" in text for n in names)  # new names, like the real ones
        (copy / rel).write_text(planted.texts[rel])
        report = run_tests(copy, [c.test_id for c in planted.canaries], timeout_s=60, env=_FAST)
        for canary in planted.canaries:
            wanted = report.failed if canary.kind == "fails" else report.passed
            assert canary.test_id in wanted, (canary, report.output_tail)


_CALC = """\
import os, subprocess, sys

FIRST = not os.path.exists("/tmp/work/first")
if FIRST:  # the first test process leaves a daemon that writes a file a second later
    open("/tmp/work/first", "w").close()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8); "
                      "open('/tmp/work/late', 'w')"], start_new_session=True)


def add(a, b):
    return a + b
"""
_HIDDEN = """\
import os, time
import pytest
import calc


def test_add():
    assert calc.add(2, 3) == 5


def test_tree_is_read_only():
    with pytest.raises(OSError):
        open("calc.py", "a")


@pytest.mark.parametrize("n", range(4))
def test_no_daemon_of_an_earlier_child(n):
    if not calc.FIRST:
        time.sleep(1.2)
        assert not os.path.exists("/tmp/work/late")
"""


def test_the_tree_is_read_only_to_the_tests_and_no_child_outlives_its_turn(tmp_path):
    from vt_envs.domains.swe.evaluation import run_hidden_tests
    from vt_envs.domains.swe.workspace import Workspace
    from vt_envs.sandbox.isolation import resolve_isolation
    from vt_envs.sandbox.policy import SYSTEM_PATHS, SandboxPolicy

    pristine = tmp_path / "pristine"
    (pristine / "tests").mkdir(parents=True)
    (pristine / "calc.py").write_text(_CALC)
    (pristine / "tests" / "test_hidden.py").write_text(_HIDDEN)
    given = tmp_path / "given"
    shutil.copytree(pristine, given)
    (given / "tests" / "test_hidden.py").unlink()
    ids = ["tests/test_hidden.py::test_add", "tests/test_hidden.py::test_tree_is_read_only"]
    ids += [f"tests/test_hidden.py::test_no_daemon_of_an_earlier_child[{n}]" for n in range(4)]
    isolation = resolve_isolation(SandboxPolicy(host_paths=SYSTEM_PATHS))
    copy = Workspace(given)
    try:
        for seed in range(2):
            outcome = asyncio.run(
                run_hidden_tests(copy, pristine=pristine, test_ids=ids,
                                 test_files=["tests/test_hidden.py"], isolation=isolation,
                                 fail_to_pass=ids[:1], rng=random.Random(seed))
            )  # fmt: skip
            # Three real tests in each of two children: a checker in each.
            assert outcome.children == 2 and outcome.canaries >= 3
            assert outcome.status == "ok" and outcome.passed == set(ids), outcome
    finally:
        copy.close()
