"""The boundary between model code and the host process, case by class.

Each class is run through ``tool.call`` and through an env made with
``gym.make`` (``VTTest/Sandbox-v0``: the python and bash tools): forged
protocol frames, host services on UNIX sockets, fork mode's warm parent,
threads a call leaves running, a cancelled start, a host that is a child
subreaper, and a shell whose builtins the agent redefined.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import gymnasium as gym
import pytest
from env_helpers import sandbox_processes

from vt_envs.tools.bash import BashTool
from vt_envs.tools.python import PythonTool


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _to_every_fd(payload: str) -> str:
    """Code that writes ``payload`` (a bytes expression) to every fd from 3 to 63."""
    return (
        "import os, struct\n"
        f"data = {payload}\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, data)\n"
        "    except OSError:\n"
        "        pass\n"
        "'sent'"
    )


FORGERIES = {
    "huge_length": _to_every_fd("struct.pack('>I', 600_000_000) + b'x' * 65536"),
    "not_an_object": _to_every_fd("struct.pack('>I', 2) + b'[]'"),
    "deeply_nested": _to_every_fd("struct.pack('>I', 200_000) + b'[' * 200_000"),
    "another_requests_reply": _to_every_fd(
        "(lambda b: struct.pack('>I', len(b)) + b)"
        '(b\'{"status": "ok", "value": "42", "nonce": "forged"}\')'
    ),
    "rebind_json_dumps": (
        "import json\njson.dumps = lambda obj, **kw: '{\"status\": \"ok\"}'\n'rebound'"
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(FORGERIES))
async def test_forged_frames_are_a_crashed_worker_never_a_host_failure(name):
    tool = PythonTool(timeout_s=3)
    session = await tool.open_session(None)
    try:
        await tool.call(session, {"code": "x = 1"})
        _reset_peak()
        before = _rss_mb()
        result = await tool.call(session, {"code": FORGERIES[name]})  # never raises
        assert isinstance(result.text, str)
        assert _rss_mb() - before < 64, "a forged frame grew the host"
        for n in range(3):  # every later call answers for itself
            after = await tool.call(session, {"code": f"print({n} * 7)"})
            assert after.ok and after.text == str(n * 7), after
    finally:
        await tool.close_session(session)


def test_forged_frames_through_gym_make(sandbox_env_id):
    env = gym.make(sandbox_env_id)
    env.reset(seed=0)
    for code in FORGERIES.values():
        env.step(f"<python>{code}</python>")
        _, _, _, _, info = env.step("<python>print('fine')</python>")
        assert info["message"]["content"] == "fine"
    env.close()


@pytest.mark.asyncio
async def test_threads_a_call_leaves_running_are_reported():
    tool = PythonTool(timeout_s=3)
    session = await tool.open_session(None)
    try:
        code = (
            "import threading, time\n"
            "threading.Thread(target=lambda: time.sleep(30), daemon=True).start()\n'started'"
        )
        result = await tool.call(session, {"code": code})
        assert result.ok and "1 thread(s) this code started are still running" in result.text
        assert result.metrics["lingering_threads"] == 1.0
        quiet = await tool.call(session, {"code": "1 + 1"})
        assert quiet.text.startswith("2")
    finally:
        await tool.close_session(session)


@pytest.fixture
def host_unix_listener():
    """A UNIX-socket server in a world-accessible folder outside /tmp, /root and /home."""
    folder = tempfile.mkdtemp(prefix="vt-host-socket-", dir="/var/tmp")
    os.chmod(folder, 0o777)
    path = os.path.join(folder, "service.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(5)
    server.setblocking(False)
    yield path, server
    server.close()
    os.unlink(path)
    os.rmdir(folder)


def _assert_no_connection(server: socket.socket) -> None:
    time.sleep(0.2)
    with pytest.raises(BlockingIOError):
        server.accept()


@pytest.mark.asyncio
async def test_no_host_unix_socket_is_reachable(host_unix_listener):
    path, server = host_unix_listener
    python, bash = PythonTool(timeout_s=5), BashTool(timeout_s=5)
    connect = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\n'connected'"
    session = await python.open_session(None)
    try:
        result = await python.call(session, {"code": connect})
        assert not result.ok and "PermissionError" in result.text
        pair = await python.call(session, {"code": "import socket\nlen(socket.socketpair())"})
        assert pair.ok and pair.text == "2"  # socketpair still works (multiprocessing.Pipe)
    finally:
        await python.close_session(session)
    session = await bash.open_session(None)
    try:
        script = f"python3 - <<'PY'\n{connect}\nprint('connected')\nPY\necho rc=$?"
        result = await bash.call(session, {"command": script})
        assert "PermissionError" in result.text and "rc=1" in result.text
    finally:
        await bash.close_session(session)
    _assert_no_connection(server)


def test_no_host_unix_socket_through_gym_make(sandbox_env_id, host_unix_listener):
    path, server = host_unix_listener
    env = gym.make(sandbox_env_id)
    env.reset(seed=0)
    code = f"import socket\nsocket.socket(socket.AF_UNIX).connect({path!r})"
    _, _, _, _, info = env.step(f"<python>{code}</python>")
    assert "PermissionError" in info["message"]["content"]
    env.close()
    _assert_no_connection(server)


FORK_ATTACKS = (
    "import os\nopen(f'/proc/{os.getppid()}/mem', 'r+b')",
    "import os\nopen(f'/proc/{os.getppid()}/maps').read()",
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "assert libc.ptrace(16, os.getppid(), 0, 0) == 0, ctypes.get_errno()",
)


@pytest.mark.asyncio
@pytest.mark.parametrize("attack", FORK_ATTACKS, ids=["mem", "maps", "ptrace"])
async def test_fork_mode_children_cannot_touch_the_warm_parent(attack):
    tool = PythonTool(mode="fork", timeout_s=5)
    session = await tool.open_session(None)
    try:
        await tool.call(session, {"code": "import builtins\nbuiltins.leak = 'from a call'"})
        result = await tool.call(session, {"code": attack})
        assert not result.ok and (
            "PermissionError" in result.text or "AssertionError: 1" in result.text
        )
        pristine = await tool.call(session, {"code": "import builtins\nhasattr(builtins, 'leak')"})
        assert pristine.text == "False"
    finally:
        await tool.close_session(session)


def test_fork_mode_through_gym_make(sandbox_env_id):
    env = gym.make(sandbox_env_id, python_mode="fork")
    env.reset(seed=0)
    _, _, _, _, info = env.step(f"<python>{FORK_ATTACKS[0]}</python>")
    assert "PermissionError" in info["message"]["content"]
    env.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("lazy", [False, True], ids=["at-reset", "at-first-call"])
async def test_a_cancelled_start_leaves_no_sandbox(lazy):
    tool = PythonTool(timeout_s=5, lazy_start=lazy)
    before = sandbox_processes()
    cancelled = 0
    for delay in (0.0, 0.005, 0.01, 0.02, 0.03):
        session = None
        try:
            if lazy:  # the sandbox starts inside the first call
                session = await tool.open_session(None)
                await asyncio.wait_for(tool.call(session, {"code": "1"}, timeout_s=5), delay)
            else:
                session = await asyncio.wait_for(tool.open_session(None), delay)
        except asyncio.TimeoutError:
            cancelled += 1
        if session is not None:
            await tool.close_session(session)
    assert cancelled >= 3
    deadline = time.monotonic() + 5
    while sandbox_processes() - before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sandbox_processes() - before == set()


SUBREAPER_SCRIPT = textwrap.dedent(
    """
    import asyncio, ctypes, json, os, sys, time
    assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    from vt_envs.tools.bash import BashTool
    from vt_envs.tools.python import PythonTool

    async def main():
        for tool, key, slow, fast in (
            (PythonTool(timeout_s=1), "code", "import time\\ntime.sleep(5)", "1"),
            (BashTool(timeout_s=1), "command", "sleep 5", "echo 1"),
        ):
            session = await tool.open_session(None)
            await tool.call(session, {key: slow})  # a timeout: killed and restarted
            await tool.call(session, {key: fast})
            await tool.close_session(session)

    asyncio.run(main())
    time.sleep(0.3)
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            if state == "Z" and int(ppid) == os.getpid():
                zombies.append(int(entry))
    print(json.dumps(zombies))
    """
)


def test_every_sandbox_process_is_reaped_when_the_host_is_a_subreaper():
    done = subprocess.run(
        [sys.executable, "-c", SUBREAPER_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


REDEFINITIONS = (
    "cat() { echo fake; }; printf() { :; }; kill() { :; }; wait() { :; }; eval() { :; }\n"
    "builtin() { :; }; command() { :; }; read() { :; }; set() { :; }; unalias() { :; }\n"
    "shopt -s expand_aliases; alias printf=true; enable -n printf kill\n"
    "sleep 1000 &\necho defined"
)


@pytest.mark.asyncio
async def test_the_shell_bookkeeping_survives_redefined_builtins():
    tool = BashTool(timeout_s=5)
    session = await tool.open_session(None)
    try:
        first = await tool.call(session, {"command": REDEFINITIONS})
        assert first.ok and first.text == "defined\n[exit code 0]", first
        pids = session.process.host_pids()
        assert (await tool.call(session, {"command": "ps -e | grep -c sleep"})).text.startswith(
            "0"
        )  # the background job did not outlive its call
        for command, expected in (("echo $((6 * 7))", "42"), ("printf '%s\\n' 5", "5")):
            after = await tool.call(session, {"command": command})
            assert after.ok and after.text == f"{expected}\n[exit code 0]", after
        # the agent's own functions are its state and persist (cat() was not one we need)
        assert (await tool.call(session, {"command": "cat"})).text.startswith("fake")
        assert session.restarts == 0 and session.process.host_pids() == pids
    finally:
        await tool.close_session(session)


def test_redefined_builtins_through_gym_make(sandbox_env_id):
    env = gym.make(sandbox_env_id)
    env.reset(seed=0)
    env.step(f"<bash>{REDEFINITIONS}</bash>")
    _, _, _, _, info = env.step("<bash>echo still $((1 + 1))</bash>")
    assert info["message"]["content"] == "still 2\n[exit code 0]"
    env.close()


def test_a_service_package_under_a_masked_root_is_importable(tmp_path):
    """An editable checkout in /tmp (or ~): the sandbox's empty /tmp hides it, so the
    service's package directory is bound back read-only (CI once failed every SQL test)."""
    from vt_envs.sandbox import SandboxPolicy, resolve_isolation
    from vt_envs.sandbox.service import ServiceSession

    assert str(tmp_path).startswith("/tmp/")
    package = tmp_path / "vtprobe_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "echo.py").write_text(
        "import os\n"
        "def serve(options):\n"
        "    return lambda payload: {'got': payload['x'], 'file': __file__,\n"
        "                            'writable': os.access(os.path.dirname(__file__), os.W_OK)}\n"
    )
    spec = {
        "module": "vtprobe_pkg.sub.echo",
        "packages": {"vtprobe_pkg": str(package), "vtprobe_pkg.sub": str(package / "sub")},
        "options": {},
    }
    isolation = resolve_isolation(SandboxPolicy())
    if not isolation.sandboxed:
        pytest.skip("no sandbox backend here")

    async def main():
        session = ServiceSession(isolation, service=spec)
        try:
            return await session.request({"x": 7}, timeout_s=10)
        finally:
            await session.close()

    reply = asyncio.run(main())
    assert reply["got"] == 7 and reply["file"].startswith("/tmp/vt-service-code/vtprobe_pkg/")
    assert reply["writable"] is False
