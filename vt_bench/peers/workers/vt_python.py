"""VT side of the Python tool comparison: calls into one sandboxed persistent session."""

from __future__ import annotations

import asyncio

from _loop import serve


def setup(params):
    from vt_envs.core.task import Task
    from vt_envs.tools.python import PythonTool

    loop = asyncio.new_event_loop()
    tool = PythonTool()
    session = loop.run_until_complete(tool.open_session(Task("peers", "", None)))
    return loop, tool, session, params["codes"]


def run(state, n):
    loop, tool, session, codes = state
    ok = 0
    for i in range(n):
        result = loop.run_until_complete(tool.call(session, {"code": codes[i % len(codes)]}))
        ok += result.ok and bool(result.text.strip())
    return n, ok


if __name__ == "__main__":
    serve(setup, run)
