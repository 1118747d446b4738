"""The persistent, sandboxed bash shell of one episode (host side).

One ``bash`` process per episode: ``cd``, variables and functions persist
across calls. Each call's text is handed to the shell inside a quoted heredoc
with a random delimiter and run with ``eval`` (so multi-line scripts, loops
and heredocs work and a syntax error stays inside the call), with stdin from
``/dev/null`` (a command cannot read the protocol stream). After each call
the shell undoes what could subvert its bookkeeping — functions or aliases
named like the builtins it uses, disabled builtins, traps, ``set -e`` — and
kills every other process in the sandbox (``kill -9 -1``: the sandbox has its
own pid namespace, so "every process" is only the sandbox's), so background
jobs never outlive their call. Unsandboxed (the unsafe mode, no pid namespace)
``kill -9 -1`` would be every process the uid may signal — as root, the whole
machine — so there the shell kills only the other processes of its own session
(a job that calls ``setsid`` escapes: the unsafe mode contains nothing).
stdout and stderr are merged, as in a terminal.

If a call times out, or the shell exits or is replaced by ``exec``, the
sandbox is killed and a new shell started; ``restarted=True`` tells the
agent that the cwd and variables are back to their defaults.
"""

from __future__ import annotations

import math
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vt_envs.core.tool import check_timeout
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.process import Captured, SandboxProcess
from vt_envs.sandbox.session import SandboxSession, SessionClosed

__all__ = ["BashOutcome", "BashSession"]


@dataclass(frozen=True)
class BashOutcome:
    """What one command produced.

    Attributes:
        status: ``"ok"`` (the command finished; see ``exit_code``),
            ``"timeout"``, ``"exited"`` (the shell itself ended), or
            ``"closed"`` (the session was closed; nothing ran).
        output: stdout and stderr, merged and capped.
        exit_code: the command's exit status (``None`` unless ``"ok"``).
        restarted: a new shell replaced the old one; its state was lost.
    """

    status: str
    output: Captured
    exit_code: int | None = None
    restarted: bool = False
    elapsed_s: float = 0.0


# Runs after every command, before the shell's own bookkeeping. The agent may have
# defined functions or aliases named like the builtins it uses, disabled them,
# set traps or `set -e`. POSIXLY_CORRECT=1 is an assignment (nothing can intercept
# it) that turns on POSIX mode, where special builtins (unset, set, trap) are
# found before functions; they then remove what could stand in for the rest.
_SHADOWABLE = "builtin command eval printf kill wait read enable unalias trap set shopt exec"
_RESET = (
    "{ POSIXLY_CORRECT=1; } 2>/dev/null\n"
    "\\set +e +u\n"
    f"\\unset -f {_SHADOWABLE} 2>/dev/null\n"
    "\\unalias -a 2>/dev/null\n"
    "\\enable builtin command eval printf kill wait read 2>/dev/null\n"
    "\\trap - DEBUG ERR RETURN\n"
    "\\unset POSIXLY_CORRECT 2>/dev/null\n"
    "\\set +o posix\n"
)


# Unsandboxed: every process whose session (the 4th field after ``(comm)`` in
# /proc/PID/stat) is the shell's, but the shell; builtins and keywords only.
_KILL_OWN_SESSION = (
    "IFS= \\builtin read -r __vt_l < /proc/$$/stat\n"
    "IFS=' ' \\builtin read -r -a __vt_f <<< \"${__vt_l##*) }\"; __vt_sid=${__vt_f[3]}\n"
    "for __vt_p in /proc/[0-9]*; do __vt_p=${__vt_p#/proc/}; [[ $__vt_p == $$ ]] && continue\n"
    "  IFS= \\builtin read -r __vt_l < /proc/$__vt_p/stat || continue\n"
    "  IFS=' ' \\builtin read -r -a __vt_f <<< \"${__vt_l##*) }\"\n"
    '  [[ ${__vt_f[3]} == "$__vt_sid" ]] && \\builtin kill -9 "$__vt_p"\n'
    "done"
)


def _wrap(command: str, nonce: str, *, sandboxed: bool = True) -> str:
    delimiter = f"VT_EOF_{nonce}"
    kill = "\\builtin kill -9 -1" if sandboxed else _KILL_OWN_SESSION
    return (
        f"IFS= \\builtin read -r -d '' __vt_cmd <<'{delimiter}'\n{command}\n{delimiter}\n"
        '\\builtin eval "$__vt_cmd" </dev/null\n'
        "__vt_rc=$?\n"
        f"{_RESET}"
        f"{{ {kill}; \\builtin wait; }} 2>/dev/null\n"
        f"\\builtin printf '\\036%d\\036{nonce}\\036' \"$__vt_rc\"\n"
    )


class BashSession(SandboxSession):
    """One episode's shell. ``await start()``, ``await run(...)``, ``await close()``.

    ``$RANDOM`` is seeded with the episode's seed at start.
    """

    def __init__(
        self,
        isolation: Any,
        *,
        files: dict[str, str | bytes] | None = None,
        seed: int = 0,
        rw_binds: Mapping[str, str] | None = None,
        cwd: str | None = None,
        exports: Mapping[str, str] | None = None,
    ):
        super().__init__(isolation, files=files, seed=seed)
        self.rw_binds, self.cwd, self.exports = dict(rw_binds or {}), cwd, dict(exports or {})
        if not all(name.isidentifier() for name in self.exports):
            raise InvalidConfigError(f"exports must be named by identifiers, got {exports!r}")

    async def start(self) -> None:
        """Start the shell's sandbox (``rw_binds``: sandbox path -> host directory, bound
        read-write; ``cwd``: where the shell starts; ``exports``: variables exported in
        it, again after every restart). Raises ``SandboxUnavailableError``."""
        self._proc = await SandboxProcess.start(
            self.isolation, mode="bash", files=self.files, rw_binds=self.rw_binds
        )
        # Per-call `kill -9 -1` must not hit the shell's own prompt machinery; and
        # a quiet, predictable shell: no history, no job-control messages.
        cd = f"cd {shlex.quote(self.cwd)}; " if self.cwd else ""
        cd += "".join(f"export {k}={shlex.quote(v)}; " for k, v in self.exports.items())
        await self._proc.send_text(
            f"{cd}set +m +o history 2>/dev/null; PS1=''; PS2=''; RANDOM={self.seed % 32768}\n"
        )

    async def run(self, command: str, timeout_s: float) -> BashOutcome:
        """Run ``command``; never raises for anything the command does (a ``timeout_s``
        that is not a deadline raises :class:`InvalidConfigError`, before anything runs)."""
        timeout_s = check_timeout("timeout_s", timeout_s, limit=math.inf)
        try:
            return await self._serialized(lambda: self._run(command, timeout_s))
        except SessionClosed:
            return BashOutcome("closed", Captured(b"", 0))

    async def _run(self, command: str, timeout_s: float) -> BashOutcome:
        await self._ensure_started()
        nonce = secrets.token_hex(16)
        marker = f"\x1e{nonce}\x1e".encode()
        proc = self._proc
        proc.stdout.begin(marker)
        start = time.perf_counter()
        try:
            await proc.send_text(_wrap(command, nonce, sandboxed=self.isolation.sandboxed))
            lost = None
        except Exception as exc:  # the shell is gone
            lost = exc
        out = await proc.stdout.wait(timeout_s) if lost is None else proc.stdout.snapshot()
        elapsed = time.perf_counter() - start
        if proc.stdout.eof or lost is not None:  # the shell exited (or exec'd and ended)
            await self._restart()
            return BashOutcome("exited", out, None, restarted=True, elapsed_s=elapsed)
        finished = proc.stdout.finished  # the marker was seen
        if not finished:
            await self._restart()
            return BashOutcome("timeout", out, None, restarted=True, elapsed_s=elapsed)
        return _split_exit_code(out, elapsed)


def _split_exit_code(out: Captured, elapsed: float) -> BashOutcome:
    # The output ends with "\x1e<rc>" (the marker itself was already removed).
    head, sep, code = out.tail.rpartition(b"\x1e")
    try:
        exit_code = int(code) if sep else None
    except ValueError:
        exit_code = None
    suffix = len(code) + len(sep)
    data = out.data[: max(0, out.total - suffix)] if suffix else out.data
    clean = Captured(data, out.total - suffix, head[-64:])
    return BashOutcome("ok", clean, exit_code, elapsed_s=elapsed)
