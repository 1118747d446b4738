"""Bash over a working copy bound read-write into the sandbox: writes land in the copy and
nowhere else, the host's other files stay unseen, and a hung or forking command is timed out
without losing the copy or wedging the session."""

from __future__ import annotations

import asyncio

import pytest

from vt_envs.domains.swe.editor import EditorTool
from vt_envs.domains.swe.workspace import SHOWN_AS, Workspace
from vt_envs.sandbox.bash_session import BashSession
from vt_envs.sandbox.isolation import resolve_isolation
from vt_envs.sandbox.policy import SandboxPolicy


@pytest.fixture
def isolation():
    return resolve_isolation(SandboxPolicy())


@pytest.fixture
def workspace(tmp_path):
    base = tmp_path / "base"
    (base / "pkg").mkdir(parents=True)
    (base / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    ws = Workspace(base)
    yield ws
    ws.close()


def _bash(isolation, workspace):
    return BashSession(isolation, rw_binds={SHOWN_AS: str(workspace.path)}, cwd=SHOWN_AS)


async def _run(session, command, timeout_s=10.0):
    out = await session.run(command, timeout_s)
    return out, out.output.data.decode()


def test_the_shell_starts_in_the_copy_and_writes_land_there_only(isolation, workspace, tmp_path):
    secret = tmp_path / "hidden_tests.py"
    secret.write_text("SECRET = 42\n")

    async def scenario():
        session = _bash(isolation, workspace)
        await session.start()
        try:
            _, cwd = await _run(session, "pwd; ls pkg")
            assert cwd.split() == [SHOWN_AS, "calc.py"]
            out, _ = await _run(session, "sed -i 's/a + b/a - b/' pkg/calc.py && echo new > n.txt")
            assert out.exit_code == 0
            for path in ("/etc/vt_probe", "/usr/vt_probe", f"{workspace.path.parent}/probe"):
                out, text = await _run(session, f"echo x > {path}")
                assert out.exit_code != 0, (path, text)
            # The host's temp dir (other episodes' copies, this copy's private parent) and
            # the host file holding hidden tests are not visible.
            _, listing = await _run(session, f"ls /tmp; cat {secret} 2>&1; ls {tmp_path} 2>&1")
            assert "SECRET" not in listing and "vt-swe-" not in listing
            await _run(session, "ln -s / pkg/root; ln -s /etc/passwd pkg/pw.py")
        finally:
            await session.close()

    asyncio.run(scenario())
    assert (workspace.path / "pkg" / "calc.py").read_text().endswith("return a - b\n")
    assert (workspace.path / "n.txt").read_text() == "new\n"
    # What bash made, the host-side editor edits; its planted symlinks stay refused.
    tool = EditorTool(lambda task: workspace.files)
    session = asyncio.run(tool.open_session(None))
    edit = {"command": "str_replace", "path": "n.txt", "old_str": "new", "new_str": "edited"}
    done = asyncio.run(tool.call(session, edit, timeout_s=5))
    assert done.ok and (workspace.path / "n.txt").read_text() == "edited\n"
    for path in ("pkg/root/etc/passwd", "pkg/pw.py"):
        out = asyncio.run(tool.call(session, {"command": "view", "path": path}, timeout_s=5))
        assert not out.ok and "root:" not in out.text


@pytest.mark.parametrize(
    "command",
    ["sleep 1000", ":(){ :|:& };:", "while true; do :; done"],
    ids=["sleep", "forks", "spin"],
)
def test_a_hung_or_forking_command_times_out_and_the_copy_survives(isolation, workspace, command):
    async def scenario():
        session = _bash(isolation, workspace)
        await session.start()
        try:
            await _run(session, "echo kept > before.txt")
            out, _ = await _run(session, command, timeout_s=2.0)
            # A fork bomb hits the sandbox's process limit and dies out (or runs out of time).
            assert (out.status == "timeout" and out.restarted) or "(){" in command
            assert out.elapsed_s < 10
            again, cwd = await _run(session, "pwd; cat before.txt")
            assert again.exit_code == 0 and cwd.split() == [SHOWN_AS, "kept"]
        finally:
            await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert (workspace.path / "before.txt").read_text() == "kept\n"


def test_a_copy_bound_into_any_sandbox_is_bounded_by_the_kernel(isolation, tmp_path):
    """What a sandbox writes into a bound copy counts at once and stops at its bounds,
    wherever it lies: past PATH_MAX, or in a file deleted while open (a fresh copy for a
    hidden-test run gets the same bound by being a Workspace)."""
    base = tmp_path / "base"
    (base / "pkg").mkdir(parents=True)
    ws = Workspace(base, disk_quota_mb=8, max_files=600)

    async def scenario():
        session = _bash(isolation, ws)
        await session.start()
        try:
            _, text = await _run(session, "head -c 20M /dev/zero > big; echo rc=$?")
            assert "No space left" in text and "rc=1" in text
            assert ws.over_quota() is not None  # full: 8 MB and one page
            await _run(session, "rm big")
            assert ws.over_quota() is None and ws.usage()[0] < 1 << 20
            deep = "for i in $(seq 500); do mkdir dddddddddd && cd dddddddddd || break; done"
            _, text = await _run(session, f"{deep}; head -c 3M /dev/zero > f; pwd | wc -c")
            assert int(text.split()[-1]) > 4096  # past PATH_MAX
            used, entries = ws.usage()
            assert used >= 3 << 20 and entries >= 500
            _, text = await _run(session, "cd /tmp/repo; mkdir -p many; cd many; touch $(seq 200)")
            assert "No space left" in text and ws.over_quota() is not None  # 600 entries
        finally:
            await session.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        ws.close()
