"""A recycled sandbox serves its next episode as a fresh one would, through gym.make.

Episode k leaves everything it can behind — globals, files (hidden, nested,
unwritable), a session-leader daemon, a thread that keeps printing, a fork —
and episode k+1, in the same sandbox (the same bwrap process), sees none of it.
"""

from __future__ import annotations

import asyncio
import os

import gymnasium as gym
import pytest

import vt_envs  # noqa: F401  (registers the ids)

LEAVE_BEHIND = r"""
import os, subprocess, threading, time
secret = "episode-k-secret"
os.makedirs("nested/deeper", exist_ok=True)
for name in ("left.txt", ".hidden", "nested/deeper/file"):
    open(name, "w").write(secret)
os.chmod("nested/deeper", 0o500)
subprocess.Popen(["sleep", "1000"], start_new_session=True)
if os.fork() == 0:
    time.sleep(1000)
    os._exit(0)
def chatter():
    while True:
        print("LEAK from episode k", flush=True)
        time.sleep(0.005)
threading.Thread(target=chatter, daemon=True).start()
time.sleep(0.05)
print("left", sorted(os.listdir(".")))
"""

LOOK_AROUND = r"""
import os
others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
alone = others == sorted({1, os.getppid(), os.getpid()})
print("secret" in globals(), sorted(os.listdir(".")), alone)
"""


def _text(info) -> str:
    return info["message"]["content"]


def _sandbox(env):
    return env.unwrapped._live.sessions["python"].process


@pytest.fixture
def env():
    env = gym.make("VT-Math-v0", split="test", python_timeout_s=10.0)
    yield env
    env.close()


def test_the_next_episode_sees_nothing_of_the_last_one(env):
    env.reset(seed=0)
    _, _, _, _, info = env.step(f"<python>{LEAVE_BEHIND}</python>")
    assert "left ['.hidden', 'left.txt', 'nested']" in _text(info)
    first = _sandbox(env)
    env.step("<answer>0</answer>")
    env.reset(seed=1)
    _, _, _, _, info = env.step(f"<python>{LOOK_AROUND}</python>")
    assert _sandbox(env) is first  # recycled, not a new sandbox
    assert _text(info).strip() == "False [] True", _text(info)
    assert "LEAK" not in _text(info)
    _, _, _, _, info = env.step("<python>import time; time.sleep(0.05); print('quiet')</python>")
    assert _text(info).strip() == "quiet"


def test_the_sandboxs_parent_is_out_of_reach(env):
    env.reset(seed=0)
    code = (
        "import os\nppid = os.getppid()\nfor path in (f'/proc/{ppid}/mem', f'/proc/{ppid}/fd', "
        "f'/proc/{ppid}/environ'):\n    try:\n        os.listdir(path) if path.endswith('fd') "
        "else open(path, 'rb').read(1)\n        print('read', path)\n    except OSError as exc:\n"
        "        print(type(exc).__name__)"
    )
    _, _, _, _, info = env.step(f"<python>{code}</python>")
    assert _text(info).split() == ["PermissionError"] * 3, _text(info)


def test_ipc_that_outlives_a_process_is_refused(env):
    env.reset(seed=0)
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0, 4096, 0o1600), ctypes.get_errno() == 1, "
        "libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0, 0) , "
        "ctypes.get_errno() == 1)"
    )
    _, _, _, _, info = env.step(f"<python>{code}</python>")
    assert _text(info).strip() == "-1 True -1 True", _text(info)


def test_a_killed_parent_means_a_fresh_sandbox_next_time(env):
    env.reset(seed=0)
    env.step("<python>import os, signal\nos.kill(os.getppid(), signal.SIGKILL)</python>")
    first = _sandbox(env)
    env.step("<answer>0</answer>")
    env.reset(seed=1)
    _, _, _, _, info = env.step(f"<python>{LOOK_AROUND}</python>")
    assert _sandbox(env) is not first
    assert _text(info).strip() == "False [] True"


def test_a_recycled_episode_replays_its_seed(env):
    code = "import random\nprint({'apple', 'banana', 'cherry'}, hash('vt'), random.random())"
    outputs = []
    for _ in range(3):
        env.reset(seed=5)
        outputs.append(_text(env.step(f"<python>{code}</python>")[4]))
        env.step("<answer>0</answer>")
    fresh = gym.make("VT-Math-v0", split="test", recycle=False)
    fresh.reset(seed=5)
    outputs.append(_text(fresh.step(f"<python>{code}</python>")[4]))
    fresh.close()
    assert len(set(outputs)) == 1, outputs


HOSTILE = {
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "daemons": "import subprocess\nfor _ in range(5):\n    subprocess.Popen(['sleep', '1000'], "
    "start_new_session=True)",
    "output_flood_forever": "while True:\n    print('x' * 10000)",
    "memory_bomb": "x = bytearray(10**11)",
    "files_flood": "for i in range(2000):\n    open(f'f{i}', 'w').write('x' * 1000)",
    "os_exit": "import os\nos._exit(1)",
    "close_fds": "import os\nos.close(0)\nos.close(1)\nos.close(2)",
}


@pytest.mark.asyncio
@pytest.mark.parametrize("code", list(HOSTILE.values()), ids=list(HOSTILE))
async def test_after_a_hostile_episode_the_next_one_starts_clean(code):
    from sandbox_helpers import SMALL

    from vt_envs.tools.python import PythonTool

    tool = PythonTool(timeout_s=3, policy=SMALL)
    try:
        session = await tool.open_session(None)
        await tool.call(session, {"code": code})
        await tool.close_session(session)
        following = await tool.open_session(None)
        result = await tool.call(following, {"code": LOOK_AROUND})
        assert result.text.strip() == "False [] True", result.text
        await tool.close_session(following)
    finally:
        await tool.aclose()


def test_a_recycled_episode_holds_the_same_descriptors_as_a_fresh_one():
    code = "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    seen = []
    for recycle in (True, False):
        env = gym.make("VT-Math-v0", split="test", recycle=recycle)
        for seed in (0, 1):  # with recycling, the second episode is a recycled one
            env.reset(seed=seed)
            seen.append(_text(env.step(f"<python>{code}</python>")[4]).strip())
            env.step("<answer>0</answer>")
        env.close()
    assert len(set(seen)) == 1, seen


DEEP_TREE = """
import os
top = os.getcwd()
os.mkdir("d"); os.chdir("d")
for _ in range(20):  # 20 names of 250 characters: deeper than PATH_MAX
    os.mkdir("x" * 250); os.chdir("x" * 250)
open("secret.txt", "w").write("episode-k-secret")
os.chdir(top)
"""

# Writes a ready message to the control pipe after the call has answered, hoping the
# host takes it for the recycled interpreter's.
FORGED_READY = """
import json, os, struct, sys, threading, time
ctrl = int(sys.argv[1])
def later():
    time.sleep(0.2)
    data = json.dumps({"status": "ready", "pid": 1}).encode()
    os.write(ctrl, struct.pack(">I", len(data)) + data)
threading.Thread(target=later).start()
"""


@pytest.mark.parametrize("code", [DEEP_TREE, FORGED_READY], ids=["deep_tree", "forged_ready"])
def test_what_an_episode_leaves_past_its_end_never_reaches_the_next(env, code):
    import time

    env.reset(seed=0)
    env.step(f"<python>{code}</python>")
    first = _sandbox(env)
    time.sleep(0.5)  # the policy generates its next turn: a forged frame lands meanwhile
    env.step("<answer>0</answer>")
    env.reset(seed=1)
    listing = "<python>x = 1; print(sorted(__import__('os').listdir('.')))</python>"
    _, _, _, _, info = env.step(listing)
    assert _sandbox(env) is first  # cleaned and recycled, not replaced
    assert _text(info).strip() == "[]", _text(info)
    _, _, _, _, info = env.step("<python>print('x' in globals())</python>")
    assert _text(info).strip() == "True", _text(info)  # the same interpreter: in step


def _host_pid_of(proc, inner_pid: int) -> int:
    """The host pid of the sandbox process whose own pid namespace calls it ``inner_pid``."""
    for pid in proc.host_pids():
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:") and int(line.split()[-1]) == inner_pid:
                    return pid
    raise AssertionError(f"no process of the sandbox is pid {inner_pid} inside it")


@pytest.mark.asyncio
async def test_bytes_left_in_the_request_pipe_are_dropped_at_recycling():
    """What sits in the request pipe when an episode ends (a non-root host's sandbox
    can reopen it for writing and plant a request) never reaches the next interpreter.

    The interpreter is frozen while the bytes are planted, so they are certainly
    still in the pipe when the episode ends (a running interpreter would read them
    itself and die on the junk, which ends the sandbox instead: safe, but then the
    discard at recycling would go untested)."""
    import signal

    from vt_envs.sandbox.process import _frame
    from vt_envs.tools.python import PythonTool

    tool = PythonTool(timeout_s=5)
    try:
        session = await tool.open_session(None)
        inner = await tool.call(session, {"code": "import os; print(os.getpid())"})
        proc = session.process
        os.kill(_host_pid_of(proc, int(inner.text)), signal.SIGSTOP)
        planted = {"code": "print('planted')", "nonce": "x" * 32}
        proc.proc.stdin.write(_frame(planted) + b"\x00" * 1000)  # a frame, then junk
        await proc.proc.stdin.drain()
        await tool.close_session(session)  # recycles it
        following = await tool.open_session(None)
        result = await tool.call(following, {"code": "print(2)"})
        assert result.text == "2" and following.process is proc, result.text
        await tool.close_session(following)
    finally:
        await tool.aclose()


# Everything of the work dir a next episode can read besides its contents: type and mode
# bits, owner, extended attributes (POSIX ACLs among them), inode flags, and what a new
# file gets from them (a default ACL or a setgid bit reaches it).
DESCRIBE_WORKDIR = r"""
import fcntl, os, struct
def flags(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return struct.unpack("<i", fcntl.ioctl(fd, 0x80086601, bytes(8))[:4])[0]
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)
def describe(path):
    st = os.stat(path)
    return (oct(st.st_mode), st.st_uid, st.st_gid, flags(path),
            [(n, os.getxattr(path, n)) for n in sorted(os.listxattr(path))])
try:
    open("probe", "w").close()
    made = describe("probe")
    os.unlink("probe")
except OSError as exc:
    made = type(exc).__name__
print(describe("."), made, os.listdir("."))
"""

# Marks the work dir every way an unprivileged owner can, leaving no file behind
# (a file would be removed, whatever it carries).
MARK_WORKDIR = r"""
import fcntl, os, struct
os.setxattr(".", "user.vt", b"episode-k")
entry = lambda tag: struct.pack("<HHI", tag, 7, 0xFFFFFFFF)
acl = struct.pack("<I", 2) + entry(1) + entry(4) + entry(0x20)  # default ACL: rwx for all
os.setxattr(".", "system.posix_acl_default", acl)
fd = os.open(".", os.O_RDONLY)
try:  # chattr +d +A (nodump, noatime), where the file system has inode flags
    fcntl.ioctl(fd, 0x40086602, struct.pack("<i", 0x40 | 0x80) + bytes(4))
except OSError:
    pass
os.close(fd)
os.chmod(".", 0o2555)  # setgid, and nobody may write into it
print(sorted(os.listxattr(".")), oct(os.stat(".").st_mode))
"""


def test_a_recycled_work_dir_has_the_metadata_of_a_fresh_one(env):
    fresh = gym.make("VT-Math-v0", split="test", recycle=False)
    fresh.reset(seed=1)
    expected = _text(fresh.step(f"<python>{DESCRIBE_WORKDIR}</python>")[4]).strip()
    fresh.close()
    env.reset(seed=0)
    _, _, _, _, info = env.step(f"<python>{MARK_WORKDIR}</python>")
    assert _text(info).strip() == "['system.posix_acl_default', 'user.vt'] 0o42555", _text(info)
    first = _sandbox(env)
    env.step("<answer>0</answer>")
    env.reset(seed=1)
    _, _, _, _, info = env.step(f"<python>{DESCRIBE_WORKDIR}</python>")
    assert _sandbox(env) is first  # restored and recycled, not replaced
    assert _text(info).strip() == expected
    assert "user.vt" not in expected and "0o40755" in expected  # (a fresh one is plain)


CRASHES = {
    "sigkill": "import os\nos.kill(os.getpid(), 9)",
    "os_exit": "import os\nos._exit(1)",
    "segfault": "import ctypes\nctypes.string_at(0)",
}


@pytest.mark.parametrize("recycle", [True, False], ids=["recycled", "fresh"])
@pytest.mark.parametrize("code", list(CRASHES.values()), ids=list(CRASHES))
def test_a_crash_is_reported_at_once_not_at_the_deadline(code, recycle):
    """The interpreter dying is a crash, seen when it happens: with a 30 s deadline the
    observation comes back in seconds, in the first episode and in a recycled one,
    and the next call runs in a fresh interpreter."""
    import time

    env = gym.make("VT-Math-v0", split="test", python_timeout_s=30.0, recycle=recycle)
    first = None
    try:
        for seed in (0, 1):
            env.reset(seed=seed)
            _, _, _, _, info = env.step("<python>x = 1\nprint('up')</python>")
            assert _text(info).strip() == "up"
            if seed == 1:
                assert (_sandbox(env) is first) == recycle  # episode 0's replacement, recycled
            started = time.monotonic()
            _, _, _, _, info = env.step(f"<python>{code}</python>")
            elapsed = time.monotonic() - started
            assert info["tool"]["error"] == "crashed", (info["tool"], elapsed)
            assert elapsed < 10.0, elapsed  # (the deadline is 30 s)
            _, _, _, _, info = env.step("<python>print('x' in globals())</python>")
            assert info["tool"]["ok"] and _text(info).strip() == "False", _text(info)
            first = _sandbox(env)
            env.step("<answer>0</answer>")
    finally:
        env.close()


@pytest.mark.asyncio
async def test_a_tool_shared_by_many_sessions_recycles_a_sandbox_for_each():
    """A tool server's PythonTool serves many sessions at once: after 6 concurrent
    episodes end (one after another), the next 6 run in their recycled sandboxes, none
    started afresh (before: 2 kept per tool, so 4 of every 6 paid a cold start)."""
    import psutil

    from vt_envs.tools.python import PythonTool

    me = psutil.Process()
    tool = PythonTool(timeout_s=10)

    async def round_of(n: int) -> set[int]:
        sessions = [await tool.open_session(None) for _ in range(n)]
        results = await asyncio.gather(*(tool.call(s, {"code": "print(1)"}) for s in sessions))
        assert all(r.ok for r in results), [r.text for r in results]
        sandboxes = {p.pid for p in me.children()}
        for session in sessions:
            await tool.close_session(session)
        return sandboxes

    try:
        first = await round_of(6)
        second = await round_of(6)
    finally:
        await tool.aclose()
    assert len(first) >= 6
    assert second == first  # the same sandboxes, recycled
