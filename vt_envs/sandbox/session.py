"""What the Python worker and the bash session share: one sandboxed process per
episode, serialized calls, restarted after a timeout or crash, killed on close.

The call contract (see :mod:`vt_envs.core.tool`) is enforced here, once for
both: calls on one session never overlap (a lock); a call cancelled at any
await — the env's backstop, ``env.close()``, Ctrl-C — kills its process at
once, so the next call starts a fresh one instead of reading the cancelled
call's reply; and a session closed once never restarts.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.process import SandboxProcess

__all__ = ["SandboxSession", "SessionClosed"]

T = TypeVar("T")


class SessionClosed(Exception):
    """Internal: a call reached a session after ``close()``."""


class SandboxSession(abc.ABC):
    """Owns one episode's :class:`SandboxProcess`; subclasses say how to start it.

    Args:
        isolation: the resolved sandbox backend.
        files: files written into the work dir at start (relative path -> content).
        seed: the episode's seed, for the randomness inside (``random``, ``$RANDOM``).
    """

    def __init__(
        self,
        isolation: Isolation,
        *,
        files: dict[str, str | bytes] | None = None,
        seed: int = 0,
    ):
        self.isolation, self.files, self.seed = isolation, dict(files or {}), int(seed)
        self._proc: SandboxProcess | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.restarts = 0

    @property
    def process(self) -> SandboxProcess | None:
        return self._proc

    @property
    def closed(self) -> bool:
        return self._closed

    @abc.abstractmethod
    async def start(self) -> None:
        """Start (or take from a pool) the sandboxed process into ``self._proc``."""

    async def _serialized(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call`` alone on this session; a cancellation kills the process."""
        async with self._lock:
            if self._closed:
                raise SessionClosed
            try:
                return await call()
            except BaseException:
                # Mid-request the process may still answer: it must never answer
                # the next call. Kill it now (and reap it, even if cancelled again);
                # the next call starts a fresh one.
                if self._proc is not None:
                    self._proc.kill_now()
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(self._proc.kill())
                raise

    async def _ensure_started(self) -> None:
        if self._proc is None or not self._proc.alive:
            await self._restart()

    async def _restart(self) -> None:
        if self._proc is not None:
            await self._proc.kill()
        if self._closed:
            raise SessionClosed
        if self._proc is not None:
            self.restarts += 1
        self._proc = None
        await self.start()
        if self._closed:  # closed while it started
            await self._proc.kill()
            raise SessionClosed

    async def close(self) -> None:
        """Kill the session's sandbox and refuse every later call. Idempotent."""
        self._closed = True
        if self._proc is not None:
            await self._proc.kill()
