"""What the Python worker and the bash session share: one sandboxed process per
episode, restarted after a timeout or crash, killed on close."""

from __future__ import annotations

import abc

from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.process import SandboxProcess

__all__ = ["SandboxSession"]


class SandboxSession(abc.ABC):
    """Owns one episode's :class:`SandboxProcess`; subclasses say how to start it."""

    def __init__(self, isolation: Isolation, *, files: dict[str, str | bytes] | None = None):
        self.isolation, self.files = isolation, dict(files or {})
        self._proc: SandboxProcess | None = None
        self.restarts = 0

    @property
    def process(self) -> SandboxProcess | None:
        return self._proc

    @abc.abstractmethod
    async def start(self) -> None:
        """Start (or take from a pool) the sandboxed process into ``self._proc``."""

    async def _restart(self) -> None:
        if self._proc is not None:
            await self._proc.kill()
            self.restarts += 1
        self._proc = None
        await self.start()

    async def close(self) -> None:
        """Kill the session's sandbox. Idempotent."""
        if self._proc is not None:
            await self._proc.kill()
