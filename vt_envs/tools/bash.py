"""``bash``: a persistent, sandboxed shell per episode.

The only way model-written shell commands run in VT. The working directory
and exported variables persist across calls; background jobs end with their
call; stdout and stderr are merged and capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from vt_envs.core.tool import Tool, ToolResult
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.bash_session import BashOutcome, BashSession
from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.tools._sandboxed import cap_text, decode, resolve, task_files, truncation_note

__all__ = ["BashTool"]


class BashTool(Tool):
    """Run shell commands in the episode's sandboxed bash.

    Args:
        timeout_s: wall-clock limit of one call; on expiry the shell is killed
            and a new one started (cwd and variables are reset; the agent is told).
        policy: sandbox limits; default :class:`SandboxPolicy()`.
        isolation: shortcut for ``policy.isolation``.
        max_output_chars: cap on the text returned to the agent.

    Raises:
        SandboxUnavailableError: no isolation layer works here.
    """

    name: ClassVar[str] = "bash"
    description: ClassVar[str] = (
        "Run bash commands in a sandboxed shell. The working directory and exported "
        "variables persist between calls; background jobs are stopped when the call ends. "
        "Output (stdout and stderr) and the exit code are returned. No network access."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "Shell commands to run."}},
        "required": ["command"],
        "additionalProperties": False,
    }
    tag_argument: ClassVar[str | None] = "command"

    def __init__(
        self,
        *,
        timeout_s: float = 30.0,
        policy: SandboxPolicy | None = None,
        isolation: str | None = None,
        max_output_chars: int = 8000,
    ):
        super().__init__(timeout_s=timeout_s)
        if max_output_chars < 100:
            raise InvalidConfigError(f"max_output_chars must be >= 100, got {max_output_chars}")
        self.isolation = resolve(policy, isolation)
        self.max_output_chars = max_output_chars

    async def open_session(self, task: Any, *, seed: int = 0) -> BashSession:
        session = BashSession(self.isolation, files=task_files(task), seed=seed)
        await session.start()
        return session

    async def close_session(self, session: BashSession | None) -> None:
        if session is not None:
            await session.close()

    async def call(
        self, session: BashSession, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        limit = self.deadline(timeout_s)
        return self.format(await session.run(str(arguments["command"]), limit), limit)

    def describe(self) -> dict[str, object]:
        """Which sandbox layers are in force for this tool (see :meth:`Isolation.describe`)."""
        return self.isolation.describe()

    def format(self, outcome: BashOutcome, timeout_s: float | None = None) -> ToolResult:
        """Turn an outcome into the text the agent reads, plus error kind and metrics."""
        text = decode(outcome.output).rstrip("\n")
        lost = "a new shell was started in the work dir; the cwd and variables were reset"
        error = None
        if outcome.status == "timeout":
            error = "timeout"
            limit = self.timeout_s if timeout_s is None else timeout_s
            status_line = f"Timed out after {limit:.3g} s; {lost}."
        elif outcome.status == "closed":
            error = "closed"
            status_line = "The shell is closed (the episode ended); nothing ran."
        elif outcome.status == "exited":
            error = "exited"
            status_line = f"The shell exited; {lost}."
        else:
            # A nonzero exit is information (grep found nothing), not a tool failure.
            status_line = f"[exit code {outcome.exit_code}]"
        text, capped = cap_text(text, self.max_output_chars)
        note = truncation_note(outcome.output, "output")
        lines = [line for line in (text, note, status_line) if line]
        truncated = outcome.output.truncated or capped
        # Truncated output is a successful call (the code ran): the agent reads
        # the note in the text, and metrics["truncated"] records it.
        metrics = {
            "exec_s": outcome.elapsed_s,
            "truncated": float(truncated),
            "restarted": float(outcome.restarted),
            "exit_code": float(outcome.exit_code if outcome.exit_code is not None else -1),
        }
        return ToolResult(text="\n".join(lines), ok=error is None, error=error, metrics=metrics)
