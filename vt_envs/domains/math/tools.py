"""VT-Math-v0's tool: the sandboxed, persistent Python interpreter.

It is the shared :class:`vt_envs.tools.python.PythonTool`, imported when the
first env is built (importing it resolves the sandbox), not when the domain is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vt_envs.tools.python import PythonTool

__all__ = ["python_tool"]


def python_tool(
    *,
    timeout_s: float,
    isolation: str | None,
    mode: str,
    traceback: str,
    max_output_chars: int,
    prestart: int,
    lazy_start: bool,
    recycle: bool,
) -> PythonTool:
    """The ``python`` tool with these settings (see :class:`PythonTool`)."""
    from vt_envs.tools.python import PythonTool  # imported here: it resolves the sandbox

    return PythonTool(
        timeout_s=timeout_s,
        isolation=isolation,
        mode=mode,
        traceback=traceback,
        max_output_chars=max_output_chars,
        prestart=prestart,
        lazy_start=lazy_start,
        recycle=recycle,
    )
