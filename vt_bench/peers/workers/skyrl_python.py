"""SkyRL-gym side of the Python tool comparison: its python tool on the same code."""

from __future__ import annotations

from _loop import serve


def setup(params):
    from skyrl_gym.tools import PythonCodeExecutorToolGroup

    return PythonCodeExecutorToolGroup(), params["codes"]


def run(state, n):
    group, codes = state
    ok = 0
    for i in range(n):
        out = group.execute_tool("python", codes[i % len(codes)])
        ok += bool(out) and not out.startswith("Error")
    return n, ok


if __name__ == "__main__":
    serve(setup, run)
