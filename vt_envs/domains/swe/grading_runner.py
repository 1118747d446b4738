"""The hidden-test runner that runs *inside* the grading sandbox (stdlib only).

The host sends this module's source to the sandbox's Python worker with a
plan (:func:`run_plan`); the worker never imports the repository. It first
makes itself non-dumpable, so no process it starts can read its memory or
open its descriptors through ``/proc`` (nor ptrace it: seccomp refuses that
anyway), then runs each batch of test ids in a child::

    python -s -P -c CHILD_BOOT <report fd> <token> <pytest options> <ids>

which imports pytest, and through the tests the agent's package, and
reports every test phase (setup, call, teardown) on a pipe of its own, each
line tagged with a fresh token. The runner reads the reports and the child's
exit status, and before the next child starts it kills every other process
in the sandbox (a process left behind must not tamper with the next child).
It judges nothing: it returns, per batch, each id's outcome letter
(:func:`outcome_letter`), the exit status and what was wrong with the report
stream; the host decides (:mod:`~vt_envs.domains.swe.evaluation`).

Everything a child sends is untrusted and bounded: at most
:data:`MAX_REPORT_BYTES` of reports and the last :data:`TAIL_BYTES` of
output are kept, each line is parsed in time linear in its length, and the
whole plan runs under its deadline.
"""

import json
import os
import selectors
import signal
import subprocess
import time

#: What a child runs (``python -s -P -c CHILD_BOOT fd token *pytest_args``): pytest with a
#: plugin object (no module to import or shadow) that writes one line per test phase.
CHILD_BOOT = """\
import os, sys
_fd, _tok = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:3]
import json
_w, _d = os.write, json.dumps
def _send(fields):
    data = (_tok + " " + _d(fields) + "\\n").encode("utf-8", "backslashreplace")
    while data:
        data = data[_w(_fd, data):]
class _VTReport:
    def pytest_runtest_logreport(self, report):
        # A subTest's report (pytest >= 9) repeats its test's id and phase: sent apart.
        when = "subtest" if type(report).__name__ == "SubtestReport" else report.when
        _send([report.nodeid, when, report.outcome])
    def pytest_collectreport(self, report):
        if report.failed:
            _send([report.nodeid, "collect", "failed"])
import pytest
sys.exit(int(pytest.main(sys.argv[1:], plugins=[_VTReport()])))
"""
#: Report bytes kept per child (beyond: the stream is "flooded").
MAX_REPORT_BYTES = 4 << 20
#: The longest report line (a node id is far shorter).
MAX_LINE_BYTES = 16 << 10
#: Output bytes kept per child (its tail, for diagnostics only).
TAIL_BYTES = 2000
_PHASES = ("setup", "call", "teardown")
_OUTCOMES = ("passed", "failed", "skipped")


def parse_reports(data, token, expected):
    """``(phases, problems)`` of a child's report stream ``data`` (bytes).

    ``phases``: node id -> {phase: outcome} for the ids in ``expected``;
    ``problems``: what an honest pytest never writes (``"malformed"``: a line
    without the token or not three known fields; ``"duplicate"``: a phase
    reported twice), each named once. Lines for other ids are dropped. An
    unterminated last line (the child died mid-write) is ignored. A test's
    ``subtest`` reports (any number) can only fail it: one that failed is kept as
    its ``subtest`` phase.
    """
    phases, problems = {}, []
    lines = data.split(b"\n")[:-1]  # the part after the last newline is unfinished
    prefix = token.encode() + b" "
    for line in lines:
        fields = _fields(line, prefix)
        if fields is None:
            _note(problems, "malformed")
            continue
        nodeid, when, outcome = fields
        if when == "collect" or nodeid not in expected:
            continue
        seen = phases.setdefault(nodeid, {})
        if when == "subtest":
            if outcome == "failed":
                seen["subtest"] = "failed"
            continue
        if when in seen:
            _note(problems, "duplicate")
        seen[when] = outcome
    return phases, problems


def _fields(line, prefix):
    if len(line) > MAX_LINE_BYTES or not line.startswith(prefix):
        return None
    try:
        fields = json.loads(line[len(prefix) :])
    except (ValueError, RecursionError):
        return None
    if not (isinstance(fields, list) and len(fields) == 3):
        return None
    if not all(isinstance(f, str) for f in fields):
        return None
    nodeid, when, outcome = fields
    if when not in (*_PHASES, "collect", "subtest") or outcome not in _OUTCOMES:
        return None
    return nodeid, when, outcome


def _note(problems, what):
    if what not in problems:
        problems.append(what)


def outcome_letter(phases):
    """``"P"``: setup, call and teardown each passed; ``"F"``: a phase failed or was
    skipped (a test must pass); ``"M"``: no complete report (the child died, or the
    test never ran); a failed subtest fails its test."""
    if not phases or "setup" not in phases:
        return "M"
    if any(phases.get(p) in ("failed", "skipped") for p in (*_PHASES, "subtest")):
        return "F"
    return "P" if all(phases.get(p) == "passed" for p in _PHASES) else "M"


def _make_undumpable():
    import ctypes

    pr_set_dumpable = 4
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def _kill_others(own_pid_ns):
    """SIGKILL every process of the sandbox but this one and its ancestors' init (a child's
    daemon must not live on into the next child), until none is left. Only in a pid
    namespace of the sandbox's own: elsewhere "every process" would be the host's."""
    if not own_pid_ns:
        return
    spare = {1, os.getpid(), os.getppid()}
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(200):
        alive = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in spare]
        alive = [pid for pid in alive if not _zombie(pid)]
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # gone
    return stat[stat.rindex(b")") + 2 :][:1] in (b"Z", b"X")


def _drain(child, reports_fd, output_fd, deadline):
    """Read the child's report and output pipes until it has exited and both are closed,
    or the deadline; return ``(report bytes, flooded, output tail, timed out)``."""
    selector = selectors.DefaultSelector()
    selector.register(reports_fd, selectors.EVENT_READ, "reports")
    selector.register(output_fd, selectors.EVENT_READ, "output")
    reports, tail, flooded, open_fds = bytearray(), b"", False, 2
    exited_at = None
    while open_fds:
        now = time.monotonic()
        if child.poll() is not None and exited_at is None:
            exited_at = now
        # A grandchild may hold the pipes open after the child exits: a short grace only.
        limit = deadline if exited_at is None else min(deadline, exited_at + 0.5)
        if now >= limit:
            break
        for key, _ in selector.select(min(limit - now, 0.05)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                selector.unregister(key.fd)
                open_fds -= 1
            elif key.data == "reports":
                room = MAX_REPORT_BYTES - len(reports)
                reports += chunk[: max(room, 0)]
                flooded = flooded or len(chunk) > room
            else:
                tail = (tail + chunk)[-TAIL_BYTES:]
    selector.close()
    timed_out = child.poll() is None and time.monotonic() >= deadline
    return bytes(reports), flooded, tail, timed_out


def _run_child(batch, token, plan, deadline):
    reports_r, reports_w = os.pipe()
    output_r, output_w = os.pipe()
    argv = [plan["python"], "-s", "-P", "-c", CHILD_BOOT, str(reports_w), token]
    try:
        child = subprocess.Popen(
            [*argv, *plan["pytest_args"], *batch],
            cwd=plan["cwd"],
            env={**os.environ, **plan["env"]},
            stdin=subprocess.DEVNULL,
            stdout=output_w,
            stderr=output_w,
            pass_fds=(reports_w,),
            start_new_session=True,
        )
    finally:
        os.close(reports_w)
        os.close(output_w)
    try:
        return (child, *_drain(child, reports_r, output_r, deadline))
    finally:
        os.close(reports_r)
        os.close(output_r)
        try:  # an honest child has closed its pipes because it is exiting: let it finish
            child.wait(max(0.0, min(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.wait()
        _kill_others(plan.get("own_pid_ns", False))


def run_plan(plan_json):
    """Run ``plan_json``'s batches one child each; return the JSON verdict (a str).

    The plan: ``python``, ``cwd``, ``env`` (added to this process's), ``pytest_args``,
    ``batches`` (lists of node ids), ``tokens`` (one per batch), ``timeout_s``,
    ``own_pid_ns`` (the sandbox has its own pid namespace: leftovers are killed).
    The verdict: ``batches``: per batch ``outcomes`` (one letter per id, in order),
    ``exit`` (the child's exit status; ``None`` when killed at the deadline),
    ``problems``; ``tail``: the output tail of the first batch with a failure.
    """
    _make_undumpable()
    plan = json.loads(plan_json)
    deadline = time.monotonic() + float(plan["timeout_s"])
    verdicts, tail = [], ""
    for batch, token in zip(plan["batches"], plan["tokens"]):
        if time.monotonic() >= deadline:
            verdicts.append({"outcomes": "M" * len(batch), "exit": None, "problems": []})
            continue
        child, data, flooded, out, timed_out = _run_child(batch, token, plan, deadline)
        phases, problems = parse_reports(data, token, set(batch))
        if flooded:
            _note(problems, "flooded")
        letters = "".join(outcome_letter(phases.get(test_id, {})) for test_id in batch)
        code = None if timed_out else child.returncode
        verdicts.append({"outcomes": letters, "exit": code, "problems": problems})
        if not tail and letters.replace("P", ""):
            tail = out.decode("utf-8", "replace")
    return json.dumps({"batches": verdicts, "tail": tail})
