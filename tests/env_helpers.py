"""Small tools and task sources for testing the env core (imported by tests and conftest)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from vt_envs.core.task import Task, TaskList
from vt_envs.core.tool import Tool, ToolResult


class EchoTool(Tool):
    """Echoes its text; fails on ``"fail"``, raises on ``"raise"``.

    ``"sleep N"`` sleeps N seconds ignoring its deadline (so only the env's
    backstop stops it); ``"nap N"`` sleeps too but honours the deadline and
    returns its own timeout result, as a well-behaved tool does.
    """

    grace_s = 0.3  # keeps backstop tests quick

    name = "echo"
    description = "Echo TEXT back."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    tag_argument = "text"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.opened: list[Any] = []
        self.closed: list[Any] = []

    async def open_session(self, task: Any, *, seed: int = 0) -> dict[str, Any]:
        session = {"task": task.id, "calls": 0, "seed": seed}
        self.opened.append(session)
        return session

    async def close_session(self, session: Any) -> None:
        self.closed.append(session)

    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        text = arguments["text"]
        session["calls"] += 1
        if text == "fail":
            return ToolResult.failure("Error: asked to fail.", "asked")
        if text == "raise":
            raise RuntimeError("tool bug")
        if text.startswith("sleep "):
            await asyncio.sleep(float(text.split()[1]))
        if text.startswith("nap "):
            wanted, limit = float(text.split()[1]), timeout_s or self.timeout_s
            await asyncio.sleep(min(wanted, limit))
            if wanted > limit:
                return ToolResult.failure(f"Error: timed out after {limit:g} s.", "timeout")
        return ToolResult(text)


def make_tasks(n: int = 5, split: str = "train") -> TaskList:
    return TaskList(
        [Task(id=f"t{i}", prompt=f"Say {i * 7}.", gold=str(i * 7)) for i in range(n)],
        name="echo",
        split=split,
    )


def sandbox_processes() -> set[int]:
    """Pids of the live sandboxed processes on this machine (VT's loader, by its cmdline)."""
    from vt_envs.sandbox.process import _alive

    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"vt_sandbox_inside" in f.read():
                        found.add(int(entry))
            except OSError:
                continue
    return {p for p in found if _alive(p)}
