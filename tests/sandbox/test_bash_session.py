"""BashTool / BashSession behaviour: persistence, scripts, exit codes, timeouts."""

from __future__ import annotations

import pytest
from sandbox_helpers import SMALL, assert_only_live_process

from vt_envs.core.task import Task
from vt_envs.core.tool import tool_registry
from vt_envs.tools.bash import BashTool


@pytest.fixture(scope="module")
def tool():
    return BashTool(timeout_s=3, policy=SMALL)


async def sh(tool, session, command):
    return await tool.call(session, {"command": command})


@pytest.mark.asyncio
async def test_cwd_and_exports_persist(tool):
    session = await tool.open_session(None)
    try:
        assert (
            await sh(tool, session, "mkdir -p d && cd d && export GREETING=hi")
        ).text == "[exit code 0]"
        assert (
            await sh(tool, session, "echo $GREETING; pwd")
        ).text == "hi\n/tmp/work/d\n[exit code 0]"
    finally:
        await tool.close_session(session)


@pytest.mark.asyncio
async def test_multiline_loops_heredocs_and_exit_codes(tool):
    session = await tool.open_session(None)
    try:
        script = (
            "for i in 1 2 3; do\n  echo n=$i\ndone\n"
            "cat <<'EOF' > f.txt\nline $HOME\nEOF\ncat f.txt\nfalse"
        )
        result = await sh(tool, session, script)
        assert result.ok and result.text == "n=1\nn=2\nn=3\nline $HOME\n[exit code 1]"
        assert result.metrics["exit_code"] == 1.0
        result = await sh(tool, session, "echo oops >&2; exit_status_of_unknown_cmd")
        assert "oops" in result.text and "command not found" in result.text
        assert result.text.endswith("[exit code 127]")
        assert (await sh(tool, session, "if then fi")).text.endswith("[exit code 2]")
    finally:
        await tool.close_session(session)


@pytest.mark.asyncio
async def test_timeout_restarts_with_clear_message(tool):
    session = await tool.open_session(None)
    try:
        await sh(tool, session, "cd /tmp")
        result = await sh(tool, session, "echo before; sleep 30")
        assert result.error == "timeout" and result.text.startswith("before")
        assert "cwd and variables were reset" in result.text
        assert (await sh(tool, session, "pwd")).text == "/tmp/work\n[exit code 0]"
        assert_only_live_process(session.process)
    finally:
        await tool.close_session(session)


@pytest.mark.asyncio
async def test_task_files_and_identity(tool):
    session = await tool.open_session(
        Task(id="t", prompt="", assets={"files": {"repo/x.py": "print(1)\n"}})
    )
    try:
        assert (
            await sh(tool, session, "cat repo/x.py; id -u")
        ).text == "print(1)\n1000\n[exit code 0]"
    finally:
        await tool.close_session(session)


def test_registry():
    import vt_envs.tools  # noqa: F401

    assert tool_registry.get("bash") is BashTool and BashTool.tag_argument == "command"


@pytest.mark.asyncio
async def test_unsandboxed_the_shell_kills_only_its_own_session():
    """Without a sandbox there is no pid namespace: the per-call cleanup must kill the
    shell's own background jobs and nothing else (as root, ``kill -9 -1`` was every
    process on the machine)."""
    import subprocess
    import warnings

    from vt_envs.sandbox.policy import UNSAFE_ISOLATION

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unsafe mode warns, as it should
        unsafe = BashTool(timeout_s=5, policy=SMALL, isolation=UNSAFE_ISOLATION)
    session = await unsafe.open_session(None)
    try:
        started = await sh(unsafe, session, "sleep 60 & echo $!")
        job = int(started.text.split()[0])
        after = await sh(unsafe, session, f"kill -0 {job} 2>/dev/null && echo alive || echo gone")
        assert after.text.startswith("gone")  # the job ended with its call
        assert bystander.poll() is None  # a process outside the shell's session lives on
        assert (await sh(unsafe, session, "echo still here")).text.startswith("still here")
    finally:
        await unsafe.close_session(session)
        bystander.kill()
        bystander.wait()
