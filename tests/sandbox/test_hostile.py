"""The hostile-input suite: model code that tries to exhaust, escape or break the sandbox.

Every case asserts (a) the agent gets a clear observation, (b) the host is
unaffected, (c) the same session serves the next call correctly, and (d) no
stray processes remain (during the session and after it closes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sandbox_helpers import (
    HOST_SECRET,
    SMALL,
    assert_gone,
    assert_no_connection,
    assert_only_live_process,
)

from vt_envs.core.tool import ToolResult
from vt_envs.tools.bash import BashTool
from vt_envs.tools.python import PythonTool

CANARY_DIR = "/var/tmp/vt-sandbox-canary"
TIMEOUT_S = 2.0

Check = Callable[[ToolResult], bool]


def error(kind: str, *needles: str) -> Check:
    return lambda r: not r.ok and r.error == kind and all(n in r.text for n in needles)


def truncated(*needles: str) -> Check:
    """The call succeeded but its output was cut, with a note saying so."""
    return lambda r: r.ok and r.metrics["truncated"] == 1.0 and all(n in r.text for n in needles)


def says(*needles: str) -> Check:
    return lambda r: all(n in r.text for n in needles)


def lost_state(r: ToolResult) -> bool:
    return not r.ok and "state was lost" in r.text and r.metrics["restarted"] == 1.0


PY_CASES: list[tuple[str, str, Check]] = [
    # resource exhaustion
    ("fork_bomb", "import os\nwhile True:\n    os.fork()", lambda r: not r.ok),
    ("memory_bomb_single", "x = bytearray(10**11)", error("exception", "MemoryError")),
    (
        "memory_bomb_growing",
        "a = []\nwhile True:\n    a.append(bytearray(10**7))",
        lambda r: not r.ok and ("MemoryError" in r.text or "state was lost" in r.text),
    ),
    (
        "cpu_spin",
        "while True:\n    pass",
        error("timeout", "Timed out after 2 s", "state was lost"),
    ),
    ("sleep_forever", "import time\ntime.sleep(10**6)", error("timeout", "Timed out")),
    (
        "disk_fill_one_file",
        "f = open('big', 'wb')\nwhile True:\n    f.write(b'0' * 2**20)",
        error("exception", "File too large"),
    ),
    (
        "disk_fill_many_files",
        "for i in range(1000):\n    open(f'f{i}', 'wb').write(b'0' * 2**22)",
        error("exception", "No space left on device"),
    ),
    ("output_flood_finite", "print('x' * 10**7)", truncated("stdout truncated")),
    ("output_flood_forever", "while True:\n    print('x' * 10000)", error("timeout", "Timed out")),
    (
        "deep_recursion",
        "def f(n):\n    return f(n + 1)\nf(0)",
        error("exception", "RecursionError"),
    ),
    (
        "recursion_limit_raised",
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
        lambda r: not r.ok and ("state was lost" in r.text or "Error" in r.text),
    ),
    ("huge_int_power", "10 ** 10 ** 12", lambda r: not r.ok),
    ("huge_int_str", "str(10 ** 100000)", error("exception", "ValueError")),
    # escape attempts
    ("read_etc_shadow", "open('/etc/shadow').read()", error("exception", "PermissionError")),
    (
        "read_host_env",
        "import os\nprint(os.environ.get('VT_TEST_SECRET'), sorted(os.environ))",
        says("None"),
    ),
    (
        "read_proc1_environ",
        "open('/proc/1/environ', 'rb').read()",
        error("exception", "PermissionError"),
    ),
    (
        "list_host_processes",
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
        lambda r: r.ok and max(eval(r.text.strip())) < 50,
    ),
    (
        "write_outside_workdir",
        f"open('{CANARY_DIR}/pwned', 'w').write('x')",
        error("exception", "Error: "),
    ),
    (
        "overwrite_host_file",
        f"open('{CANARY_DIR}/canary', 'w').write('pwned')",
        error("exception", "Error: "),
    ),
    (
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        error("exception", "PermissionError"),
    ),
    ("kill_pid_1", "import os\nos.kill(1, 9)", error("exception", "PermissionError")),
    (
        "kill_everything",
        "import os\nos.kill(-1, 9)\nprint('still here')",
        lambda r: "ProcessLookupError" in r.text or "still here" in r.text,
    ),
    (
        "ptrace_init",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())",  # PTRACE_ATTACH -> -1 EPERM
        says("-1 1"),
    ),
    (
        "mount_tmpfs",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.mount(b'none', b'/mnt', b'tmpfs', 0, None), ctypes.get_errno())",
        says("-1 1"),
    ),
    (
        "setuid_binary",
        "import subprocess\nr = subprocess.run(['su', '-c', 'id', 'root'], capture_output=True,"
        " stdin=subprocess.DEVNULL)\nprint(r.returncode != 0, open('/proc/self/status').read()"
        ".count('NoNewPrivs:\\t1'))",
        says("True 1"),
    ),
    (
        "symlink_to_shadow",
        "import os\nos.symlink('/etc/shadow', 's')\nopen('s').read()",
        error("exception", "PermissionError"),
    ),
    (
        "symlink_to_root_home",
        "import os\nos.symlink('/root', 'r')\nos.listdir('r')",
        lambda r: (
            (r.ok and ".pyenv" not in r.text.replace("'.pyenv'", ""))
            or r.text.strip() in ("[]", "['.pyenv']")
        ),
    ),
    (
        "proc_root_escape",
        "open('/proc/1/root/etc/shadow').read()",
        error("exception", "PermissionError"),
    ),
    (
        "raise_rlimit",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
        error("exception", "ValueError"),
    ),
    (
        "ipv6_socket",
        "import socket\nsocket.socket(socket.AF_INET6)",
        error("exception", "PermissionError"),
    ),
    # interpreter abuse
    ("sys_exit", "import sys\nsys.exit(3)", lambda r: lost_state(r) and "exit (code 3)" in r.text),
    ("os_exit", "import os\nos._exit(1)", lambda r: lost_state(r) and "crashed" in r.text),
    ("raise_system_exit", "raise SystemExit('bye')", lost_state),
    ("keyboard_interrupt", "raise KeyboardInterrupt", error("exception", "KeyboardInterrupt")),
    (
        "base_exception_subclass",
        "class Boom(BaseException):\n    pass\nraise Boom('x')",
        error("exception", "Boom: x"),
    ),
    (
        "delete_builtins",
        "import builtins\ndel builtins.print\ndel builtins.len\nprint('x')",
        error("exception", "NameError"),
    ),
    ("delete_dunder_builtins", "del __builtins__\nlen('x')", lambda r: not r.ok or "1" in r.text),
    (
        "close_stdout",
        "import sys\nsys.stdout.close()\nprint('x')",
        error("exception", "ValueError"),
    ),
    ("close_fds_1_2", "import os\nos.close(1)\nos.close(2)\n'done'", says("done")),
    (
        "binary_output",
        "import sys\nsys.stdout.buffer.write(bytes(range(256)))\nNone",
        lambda r: r.ok and "\ufffd" in r.text,
    ),
    (
        "invalid_utf8",
        "import os\nos.write(1, b'\\xff\\xfe abc\\n')",
        lambda r: r.ok and "abc" in r.text,
    ),
    ("very_long_line", "print('y' * 10**6)", truncated()),
    ("read_stdin", "input()", error("exception", "EOFError")),
    (
        "lingering_subprocess",
        "import subprocess\nsubprocess.Popen(['sleep', '1000'])\n'started'",
        says("started"),
    ),
    (
        "double_fork_setsid",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(1000)\n    os._exit(0)\n'parent'",
        says("parent"),
    ),
    (
        "ignore_sigterm_spin",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
        error("timeout"),
    ),
    (
        "forge_control_channel",
        "import os\nfor fd in range(3, 64):\n    try:\n"
        "        os.write(fd, b'\\x00\\x00\\x00\\x05junk!')\n"
        "    except OSError:\n        pass\n'sent'",
        lambda r: isinstance(r.text, str),
    ),
]

BASH_CASES: list[tuple[str, str, Check]] = [
    ("rm_rf_root", "rm -rf --no-preserve-root / 2>&1 | tail -n 2", lambda r: True),
    ("background_job", "sleep 1000 &\necho started", says("started")),
    ("setsid_nohup", "setsid nohup sleep 1000 >/dev/null 2>&1 &\necho started", says("started")),
    ("exec_replaces_shell", "exec sleep 100", error("timeout", "new shell")),
    ("exec_true", "exec true", error("exited", "new shell")),
    ("exit_shell", "exit 7", error("exited", "The shell exited")),
    ("ulimit_raise", "ulimit -n 100000", says("Operation not permitted", "[exit code 1]")),
    ("ulimit_raise_as", "ulimit -v unlimited", says("Operation not permitted")),
    ("read_root_home", "ls -A /root; cat /root/.bashrc", says("No such file")),
    ("fork_bomb", ":(){ :|:& };:", lambda r: True),
    ("read_etc_shadow", "cat /etc/shadow", says("Permission denied")),
    ("read_env", "env", lambda r: HOST_SECRET not in r.text and "VT_TEST_SECRET" not in r.text),
    ("kill_all", "kill -9 -1; echo alive", says("alive")),
    ("kill_parent", "kill -9 $PPID", says("Operation not permitted")),
    ("write_outside", f"echo x > {CANARY_DIR}/pwned", says("[exit code 1]")),
    ("mount", "mount -t tmpfs none /mnt", lambda r: "[exit code 0]" not in r.text),
    ("disk_fill", "dd if=/dev/zero of=big bs=1M count=100", says("File too large")),
    ("output_flood", "yes | head -c 5000000", truncated("output truncated")),
    ("output_flood_forever", "yes", error("timeout")),
    ("binary_output", "head -c 2000 /dev/urandom; echo", lambda r: r.ok),
    ("su_root", "su -c id root </dev/null", lambda r: "uid=0" not in r.text),
    ("cpu_spin", "while :; do :; done", error("timeout", "Timed out")),
]


@pytest.fixture(scope="module", autouse=True)
def canary():
    os.makedirs(CANARY_DIR, exist_ok=True)
    path = os.path.join(CANARY_DIR, "canary")
    with open(path, "w") as f:
        f.write("intact")
    yield path
    assert Path(path).read_text() == "intact", "the host canary file was modified"
    assert not os.path.exists(os.path.join(CANARY_DIR, "pwned"))


@pytest.fixture(scope="module")
def python_tool():
    return PythonTool(timeout_s=TIMEOUT_S, policy=SMALL, lazy_start=False, recycle=False)


@pytest.fixture(scope="module")
def bash_tool():
    return BashTool(timeout_s=TIMEOUT_S, policy=SMALL)


def _host_intact(canary: str, text: str) -> None:
    assert HOST_SECRET not in text
    assert Path(canary).read_text() == "intact"
    assert not os.path.exists(os.path.join(CANARY_DIR, "pwned"))


@pytest.mark.asyncio
@pytest.mark.parametrize("code,check", [c[1:] for c in PY_CASES], ids=[c[0] for c in PY_CASES])
async def test_python_hostile(python_tool, canary, loopback_server, code, check):
    session = await python_tool.open_session(None)
    try:
        first_uid = session.process.uid
        result = await python_tool.call(session, {"code": code})
        assert isinstance(result.text, str) and result.text
        assert check(result), result  # (a)
        _host_intact(canary, result.text)  # (b)
        after = await python_tool.call(session, {"code": "print(6 * 7)"})
        assert after.ok and after.text == "42", after  # (c)
        assert_only_live_process(session.process)  # (d)
        if session.process.uid != first_uid:
            assert_gone(first_uid, set())
        uid, pids = session.process.uid, session.process.host_pids()
    finally:
        await python_tool.close_session(session)
    assert_gone(uid, pids)


@pytest.mark.asyncio
async def test_python_cannot_reach_loopback_server(python_tool, loopback_server):
    port, server = loopback_server
    session = await python_tool.open_session(None)
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        result = await python_tool.call(session, {"code": code})
        assert not result.ok and result.error == "exception"
        assert "PermissionError" in result.text or "ConnectionRefusedError" in result.text
        assert_no_connection(server)
        assert (await python_tool.call(session, {"code": "1 + 1"})).text == "2"
        assert_only_live_process(session.process)
        uid, pids = session.process.uid, session.process.host_pids()
    finally:
        await python_tool.close_session(session)
    assert_gone(uid, pids)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "command,check", [c[1:] for c in BASH_CASES], ids=[c[0] for c in BASH_CASES]
)
async def test_bash_hostile(bash_tool, canary, command, check):
    session = await bash_tool.open_session(None)
    try:
        first_uid = session.process.uid
        result = await bash_tool.call(session, {"command": command})
        assert isinstance(result.text, str) and result.text
        assert check(result), result  # (a)
        _host_intact(canary, result.text)  # (b)
        after = await bash_tool.call(session, {"command": "echo $((6 * 7))"})
        assert after.ok and after.text == "42\n[exit code 0]", after  # (c)
        assert_only_live_process(session.process)  # (d)
        if session.process.uid != first_uid:
            assert_gone(first_uid, set())
        uid, pids = session.process.uid, session.process.host_pids()
    finally:
        await bash_tool.close_session(session)
    assert_gone(uid, pids)


@pytest.mark.asyncio
async def test_bash_cannot_reach_loopback_server(bash_tool, loopback_server):
    port, server = loopback_server
    session = await bash_tool.open_session(None)
    try:
        result = await bash_tool.call(session, {"command": f"echo hi > /dev/tcp/127.0.0.1/{port}"})
        assert "[exit code 1]" in result.text
        assert_no_connection(server)
        assert_only_live_process(session.process)
    finally:
        await bash_tool.close_session(session)


def test_suite_size():
    assert len(PY_CASES) + len(BASH_CASES) + 2 >= 40
