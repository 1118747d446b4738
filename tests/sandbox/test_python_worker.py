"""PythonTool / PythonWorker behaviour: notebook semantics, formatting, modes, clean-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sandbox_helpers import SMALL, assert_gone

from vt_envs.core.task import Task
from vt_envs.core.tool import tool_registry, validate_arguments
from vt_envs.sandbox.process import pids_of_uid
from vt_envs.tools.python import PythonTool


@pytest.fixture(scope="module")
def tool():
    return PythonTool(timeout_s=5, policy=SMALL, lazy_start=False)


async def run(tool, session, code):
    return await tool.call(session, {"code": code})


@pytest.mark.asyncio
async def test_state_persists_across_calls(tool):
    session = await tool.open_session(None)
    try:
        assert (
            await run(tool, session, "import math\ndef sq(x):\n    return x * x\nn = 7")
        ).text == "(no output)"
        result = await run(tool, session, "print('n is', n)\nsq(n) + math.floor(2.5)")
        assert result.ok and result.text == "n is 7\n51"
        assert (await run(tool, session, "_ + 1")).text == "52"
    finally:
        await tool.close_session(session)


@pytest.mark.asyncio
async def test_stderr_numpy_and_sympy(tool):
    session = await tool.open_session(None)
    try:
        result = await run(tool, session, "import sys\nprint('warn', file=sys.stderr)")
        assert result.text == "warn"
        result = await run(
            tool, session, "import numpy as np, sympy\nint(np.arange(5).sum()), sympy.sqrt(8)"
        )
        assert result.ok and result.text == "(10, 2*sqrt(2))"
    finally:
        await tool.close_session(session)


@pytest.mark.asyncio
async def test_error_formats():
    short = PythonTool(timeout_s=5, policy=SMALL)
    full = PythonTool(timeout_s=5, policy=SMALL, traceback="full")
    for t, expected in (
        (short, "Error: ZeroDivisionError: division by zero"),
        (full, "Traceback (most recent call last):"),
    ):
        session = await t.open_session(None)
        try:
            result = await run(t, session, "def f():\n    return 1 / 0\nf()")
            assert not result.ok and result.error == "exception"
            assert result.text.startswith(expected)
            if t is full:
                assert 'File "<cell>", line 2, in f' in result.text and "inside" not in result.text
            syntax = await run(t, session, "def (:")
            assert syntax.error == "syntax_error" and "SyntaxError" in syntax.text
        finally:
            await t.close_session(session)


@pytest.mark.asyncio
async def test_max_output_chars_keeps_head_and_tail():
    t = PythonTool(timeout_s=5, policy=SMALL, max_output_chars=200)
    session = await t.open_session(None)
    try:
        result = await run(t, session, "for i in range(1000):\n    print(i)")
        assert result.ok and result.metrics["truncated"] == 1.0 and len(result.text) < 300
        assert result.text.startswith("0\n1\n") and result.text.endswith("999")
        assert "characters truncated" in result.text
    finally:
        await t.close_session(session)


@pytest.mark.asyncio
async def test_task_files_are_in_the_workdir(tool):
    task = Task(id="t", prompt="p", assets={"files": {"data/a.txt": "hello", "b.bin": b"\x00\x01"}})
    session = await tool.open_session(task)
    try:
        result = await run(
            tool,
            session,
            "import os\nopen('data/a.txt').read(), open('b.bin','rb').read(), os.getcwd()",
        )
        assert result.text == "('hello', b'\\x00\\x01', '/tmp/work')"
    finally:
        await tool.close_session(session)


@pytest.mark.asyncio
async def test_fork_mode_gives_fresh_state():
    t = PythonTool(timeout_s=5, policy=SMALL, mode="fork")
    session = await t.open_session(None)
    try:
        assert (await run(t, session, "x = 1\nx")).text == "1"
        result = await run(t, session, "x")
        assert result.error == "exception" and "NameError" in result.text
        crashed = await run(t, session, "import os\nos._exit(3)")
        assert crashed.error == "crashed" and "fresh interpreter" in crashed.text
        assert (await run(t, session, "2 + 2")).text == "4"
    finally:
        await t.close_session(session)


@pytest.mark.asyncio
async def test_prestarted_pool_hands_over_and_closes():
    t = PythonTool(timeout_s=5, policy=SMALL, prestart=1)
    first = await t.open_session(Task(id="a", prompt="", assets={"files": {"f.txt": "A"}}))
    second = await t.open_session(None)
    try:
        assert (await run(t, first, "open('f.txt').read()")).text == "'A'"
        assert (await run(t, second, "1")).text == "1"
    finally:
        await t.close_session(first)
        await t.close_session(second)
        pool_uids = [p.uid for p in t._pool._ready]
        await t.aclose()
    for uid in pool_uids:
        assert pids_of_uid(uid) == set()


@pytest.mark.asyncio
async def test_close_session_is_idempotent_and_leaves_nothing(tool):
    session = await tool.open_session(None)
    uid, pids = session.process.uid, session.process.host_pids()
    await tool.close_session(session)
    await tool.close_session(session)
    assert_gone(uid, pids)


def test_sandbox_dies_with_its_parent(tmp_path):
    script = textwrap.dedent("""
        import asyncio, sys, time
        from sandbox_helpers import SMALL
        from vt_envs.tools.python import PythonTool
        async def main():
            tool = PythonTool(policy=SMALL, lazy_start=False)
            session = await tool.open_session(None)
            print(session.process.uid, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.getcwd()])}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    uid = int(child.stdout.readline())
    assert pids_of_uid(uid), "the sandbox should be running"
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    while pids_of_uid(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_of_uid(uid) == set()


def test_tool_spec_and_registry():
    import vt_envs.tools  # noqa: F401  (registers the built-in tools)

    assert tool_registry.get("python") is PythonTool
    assert PythonTool.tag_argument == "code"
    assert PythonTool.parameters == {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python code to run."}},
        "required": ["code"],
        "additionalProperties": False,
    }
    assert validate_arguments(PythonTool.parameters, {"code": "1"}) is None
    assert "missing" in validate_arguments(PythonTool.parameters, {})
