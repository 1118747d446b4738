"""``python``: a persistent, sandboxed Python interpreter per episode.

The only way model-written Python runs in VT. Each episode gets its own
sandbox (see :mod:`vt_envs.sandbox`); the namespace persists across calls
like notebook cells, and the last expression's ``repr`` is shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from vt_envs.core.tool import Tool, ToolResult
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.sandbox.python_worker import PYTHON_MODES, PythonOutcome, PythonWorker, WarmPool
from vt_envs.tools._sandboxed import cap_text, decode, resolve, task_files, truncation_note

__all__ = ["TRACEBACK_STYLES", "PythonTool"]

TRACEBACK_STYLES = ("last_line", "full")


# Recycled sandboxes a tool keeps: an env's own tool runs one episode at a time (a
# vector env's sub-envs have a tool each), so one waits while the next episode starts.
# A tool shared by many sessions at once (a tool server's) keeps as many as it has had
# sessions open at once, plus one, up to _MAX_RECYCLED: each of them is memory held.
_RECYCLED = 2
_MAX_RECYCLED = 4096


class PythonTool(Tool):
    """Run Python code in the episode's sandboxed interpreter.

    Args:
        timeout_s: wall-clock limit of one call; on expiry the interpreter is
            killed and restarted (its state is lost, and the agent is told).
        policy: sandbox limits; default :class:`SandboxPolicy()`.
        isolation: shortcut for ``policy.isolation`` (``"auto"``, ``"bwrap"``,
            ``"unshare"``, or ``"none-i-understand-this-is-unsafe"``).
        mode: ``"persistent"`` (one namespace per episode) or ``"fork"``
            (fresh state per call, forked from a warm interpreter).
        traceback: ``"last_line"`` (``Error: ZeroDivisionError: division by
            zero``) or ``"full"`` (the traceback of the agent's code).
        max_output_chars: cap on the text returned to the agent.
        prestart: sandboxes kept started and waiting, so an episode's sandbox
            is a hand-over (0 starts each episode's sandbox on demand). They
            start in the background when the first episode opens (the tool
            needs the running loop), so with ``lazy_start`` even the first
            episode's first call finds one ready.
        lazy_start: start an episode's sandbox at its first call, not at reset:
            an episode that never calls Python (answers at once) costs no
            sandbox. ``False`` starts it at reset.
        recycle: an episode's sandbox serves the tool's next episode, as fresh:
            at the episode's end its sandbox's pristine parent (which never runs
            model code) kills every process of the episode, empties the writable
            directories, restores the work dir's metadata (mode bits, extended
            attributes, ACLs, inode flags) and forks a new interpreter, so no
            process, file, metadata or memory of one episode reaches the next
            (an interpreter that dies mid-episode ends the sandbox at once: a
            crash reported when it happens, not at the deadline; SysV IPC and
            keyrings are refused in every sandbox). Costs a fork instead of a sandbox start
            (~2 ms vs ~60 ms). Needs the sandbox's own pid namespace; ``False``
            starts a new sandbox for each episode.

    Raises:
        SandboxUnavailableError: no isolation layer works here.
    """

    name: ClassVar[str] = "python"
    description: ClassVar[str] = (
        "Run Python 3 code in a sandboxed interpreter. Variables, imports and functions "
        "persist between calls. Printed output and the value of the last expression are "
        "returned. No network access; files live in the current directory."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python code to run."}},
        "required": ["code"],
        "additionalProperties": False,
    }
    tag_argument: ClassVar[str | None] = "code"

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        policy: SandboxPolicy | None = None,
        isolation: str | None = None,
        mode: str = "persistent",
        traceback: str = "last_line",
        max_output_chars: int = 4000,
        prestart: int = 0,
        lazy_start: bool = True,
        recycle: bool = True,
    ):
        super().__init__(timeout_s=timeout_s)
        self.lazy_start = lazy_start
        if mode not in PYTHON_MODES:
            raise InvalidConfigError(f"mode must be one of {PYTHON_MODES}, got {mode!r}")
        if traceback not in TRACEBACK_STYLES:
            raise InvalidConfigError(
                f"traceback must be one of {TRACEBACK_STYLES}, got {traceback!r}"
            )
        if max_output_chars < 100:
            raise InvalidConfigError(f"max_output_chars must be >= 100, got {max_output_chars}")
        if prestart < 0:
            raise InvalidConfigError(f"prestart must be >= 0, got {prestart}")
        self.isolation = resolve(policy, isolation)
        self.mode, self.traceback, self.max_output_chars = mode, traceback, max_output_chars
        recycled = _RECYCLED if recycle and self.isolation.sandboxed else 0
        self._open = 0  # sessions open now (the recycled pool grows with their peak)
        self._pool = (
            WarmPool(
                self.isolation,
                size=prestart,
                recycled=recycled,
                python_mode=mode,
                recycle=bool(recycled),
            )
            if prestart or recycled
            else None
        )

    async def open_session(self, task: Any, *, seed: int = 0) -> PythonWorker:
        self._open += 1
        try:
            return await self._open_session(task, seed)
        except BaseException:
            self._open -= 1
            raise

    async def _open_session(self, task: Any, seed: int) -> PythonWorker:
        if self._pool is not None:  # prestart begins at the first episode, not its first call
            if self._pool.recycled:  # room for every session open now to come back
                wanted = min(self._open + 1, _MAX_RECYCLED)
                self._pool.recycled = max(self._pool.recycled, wanted)
            self._pool.fill()
        worker = PythonWorker(
            self.isolation,
            files=task_files(task),
            mode=self.mode,
            max_repr_chars=self.max_output_chars,
            pool=self._pool,
            seed=seed,
        )
        if not self.lazy_start:  # else the first run() starts it (SandboxSession._ensure_started)
            await worker.start()
        return worker

    async def close_session(self, session: PythonWorker | None) -> None:
        if session is not None:
            self._open -= 1
            await session.close()

    async def call(
        self, session: PythonWorker, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        limit = self.deadline(timeout_s)
        return self.format(await session.run(str(arguments["code"]), limit), limit)

    def describe(self) -> dict[str, object]:
        """Which sandbox layers are in force for this tool (see :meth:`Isolation.describe`)."""
        return self.isolation.describe()

    def format(self, outcome: PythonOutcome, timeout_s: float | None = None) -> ToolResult:
        """Turn an outcome into the text the agent reads, plus error kind and metrics."""
        parts = [decode(outcome.stdout), decode(outcome.stderr)]
        parts = [p.rstrip("\n") for p in parts if p]
        if outcome.value is not None:
            parts.append(outcome.value)
        notes = [
            truncation_note(outcome.stdout, "stdout"),
            truncation_note(outcome.stderr, "stderr"),
        ]
        if outcome.lingering_threads:
            notes.append(
                f"[note: {outcome.lingering_threads} thread(s) this code started are still "
                "running; their output may appear in later calls]"
            )
        error = None
        lost = (
            "the interpreter was restarted and its state was lost (variables, imports "
            "and definitions must be re-created)"
        )
        if self.mode == "fork":
            lost = "a fresh interpreter runs the next call"
        if outcome.status == "error":
            error = outcome.kind or "exception"
            if self.traceback == "full" and outcome.traceback:
                parts.append(outcome.traceback.rstrip("\n"))
            else:
                parts.append(f"Error: {outcome.exc_type}: {outcome.message}".rstrip(": "))
        elif outcome.status == "timeout":
            error = "timeout"
            limit = self.timeout_s if timeout_s is None else timeout_s
            parts.append(f"Timed out after {limit:.3g} s; {lost}.")
        elif outcome.status == "closed":
            error = "closed"
            parts.append("The interpreter is closed (the episode ended); nothing ran.")
        elif outcome.status == "exit":
            error = "exit"
            parts.append(f"The code called exit (code {outcome.message}); {lost}.")
        elif outcome.status != "ok":
            error = "crashed"
            parts.append(
                f"The interpreter crashed (killed by a signal or a resource limit); {lost}."
            )
        text, capped = cap_text("\n".join(parts), self.max_output_chars)
        notes = [n for n in notes if n]
        if notes:
            text = f"{text}\n" + "\n".join(notes)
        truncated = outcome.truncated or capped
        # Truncated output is a successful call (the code ran): the agent reads
        # the note in the text, and metrics["truncated"] records it.
        metrics = {
            "exec_s": outcome.elapsed_s,
            "truncated": float(truncated),
            "restarted": float(outcome.restarted),
            "output_bytes": float(outcome.stdout.total + outcome.stderr.total),
            "lingering_threads": float(outcome.lingering_threads),
        }
        return ToolResult(
            text=text or "(no output)", ok=error is None, error=error, metrics=metrics
        )

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
