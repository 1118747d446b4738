"""Runs the hostile suite as an unprivileged user; started by test_nonroot.py (as root).

Each case is the one in test_hostile.py, through the same tools, with the same
checks, except where running without root changes what the *kernel* answers
while the guarantee holds (see NONROOT_CHECKS). Prints one JSON object: the
cases run and the failures.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sandbox_helpers import HOST_SECRET, SMALL
from test_hostile import BASH_CASES, PY_CASES, TIMEOUT_S

from vt_envs.sandbox.process import _alive
from vt_envs.tools.bash import BashTool
from vt_envs.tools.python import PythonTool


def _no_error_and_alive(result) -> bool:
    # Signals to the sandbox's init from inside are dropped by the kernel; as
    # root the sender's different uid gets EPERM first. The init survives either way.
    return result.ok or "PermissionError" in result.text


NONROOT_CHECKS = {
    # /proc/1 (bwrap's init, same uid as the code without root) is hidden: the
    # code gets "no such file" where, as root, it gets "permission denied".
    ("python", "read_proc1_environ"): lambda r: not r.ok and "FileNotFoundError" in r.text,
    ("python", "proc_root_escape"): lambda r: not r.ok and "FileNotFoundError" in r.text,
    ("python", "kill_pid_1"): _no_error_and_alive,
    ("python", "kill_parent"): _no_error_and_alive,
    ("bash", "kill_parent"): lambda r: True,  # the shell answers the next call (checked)
}


async def _settled_count(process, expected: int, *, within_s: float) -> int:
    """How many of the sandbox's processes are alive once ``expected`` is reached or
    ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    live = len(process.host_pids())
    while live != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        live = len(process.host_pids())
    return live


async def run_case(tool, kind: str, name: str, code: str, check) -> str | None:
    """``None`` if the case passes, else why it failed."""
    key = "code" if kind == "python" else "command"
    check = NONROOT_CHECKS.get((kind, name), check)
    session = await tool.open_session(None)
    try:
        expected_live = len(session.process.host_pids())
        result = await tool.call(session, {key: code})
        if not check(result):
            return f"check failed: {result!r}"
        if HOST_SECRET in result.text:
            return "the host secret reached the sandbox"
        probe = "print(6 * 7)" if kind == "python" else "echo $((6 * 7))"
        after = await tool.call(session, {key: probe})
        want = "42" if kind == "python" else "42\n[exit code 0]"
        if not after.ok or after.text != want:
            return f"the next call answered {after!r}"
        # Processes the call's `kill -9 -1` hit may still be exiting (a fork bomb's
        # hundreds, on a busy machine): they must be gone soon, not at once.
        live = await _settled_count(session.process, expected_live, within_s=10.0)
        if live != expected_live:
            return f"{live} sandbox processes 10 s after the call, {expected_live} at start"
        pids = session.process.host_pids()
    finally:
        await tool.close_session(session)
    left = {p for p in pids if _alive(p)}  # (zombies waiting for a reaper count as gone)
    return f"processes left after close: {left}" if left else None


async def main() -> None:
    assert os.geteuid() != 0, "run this as an unprivileged user"
    python, bash = (
        PythonTool(timeout_s=TIMEOUT_S, policy=SMALL, lazy_start=False, recycle=False),
        BashTool(timeout_s=TIMEOUT_S, policy=SMALL),
    )
    report = {"uid": os.geteuid(), "layers": python.describe(), "ran": [], "failures": {}}
    cases = [("python", python, c) for c in PY_CASES] + [("bash", bash, c) for c in BASH_CASES]
    for kind, tool, (name, code, check) in cases:
        report["ran"].append(f"{kind}:{name}")
        try:
            failure = await run_case(tool, kind, name, code, check)
        except Exception:
            failure = traceback.format_exc()
        if failure:
            report["failures"][f"{kind}:{name}"] = failure
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
