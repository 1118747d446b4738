"""VT-Lookup-v0's tool: the value stored under a key of the episode's hidden table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vt_envs.core.tool import Tool, ToolResult

__all__ = ["LookupTool"]


class LookupTool(Tool):
    """Returns the value stored under a key in the episode's hidden table."""

    name = "lookup"
    description = "Return the value stored under KEY."
    parameters = {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    }
    tag_argument = "key"

    def __init__(self, *, timeout_s: float = 5.0, delay_s: float = 0.0):
        super().__init__(timeout_s=timeout_s)
        self.delay_s = delay_s  # simulated latency, for scheduling tests and benchmarks

    concurrent_calls = True  # the table is read-only

    async def open_session(self, task: Any, *, seed: int = 0) -> Mapping[str, str]:
        return dict(task.assets["table"]) if task is not None else {}

    async def call(
        self,
        session: Mapping[str, str],
        arguments: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> ToolResult:
        if self.delay_s:
            import asyncio

            await asyncio.sleep(self.delay_s)
        key = arguments["key"].strip()
        if key in session:
            return ToolResult(session[key])
        return ToolResult.failure(f"No key {key!r}.", "not_found")
