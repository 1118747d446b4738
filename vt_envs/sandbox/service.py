"""A sandboxed service: untrusted work (the model's SQL) done by a module in a sandbox.

A :class:`ServiceSession` owns one sandboxed process running a service
module (``serve(options) -> handle(payload) -> reply``, see ``inside.py``'s
service mode), and gives the host one call: :meth:`ServiceSession.request`.
It inherits the call contract of :class:`~vt_envs.sandbox.session.SandboxSession`:
requests never overlap, a cancelled request kills the process, and a closed
session never restarts.

The deadline is hard: a request that does not answer within its
``timeout_s`` (the service may ignore its own interrupts, as DuckDB's
optimizer does on an exponential plan), or that kills the process (memory
limits), or answers with anything but a well-formed reply to *this* request,
costs the process: it is killed, :class:`ServiceLost` is raised, and the next
request starts a fresh one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.process import SandboxProcess, WorkerLost
from vt_envs.sandbox.python_worker import WarmPool
from vt_envs.sandbox.session import SandboxSession, SessionClosed

__all__ = ["ServiceLost", "ServiceSession", "SessionClosed", "service_spec"]


class ServiceLost(Exception):
    """A request cost the service its process; ``kind`` is ``"timeout"`` or ``"crashed"``."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind, self.detail = kind, detail


def service_spec(module: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The service-mode start option for ``module`` (a dotted name inside ``vt_envs``).

    Lists the directories of the module's parent packages, so the sandbox can
    import the module without running those packages' ``__init__``.
    """
    parts = module.split(".")
    packages = {}
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        packages[name] = next(iter(importlib.import_module(name).__path__))
    return {"module": module, "packages": packages, "options": dict(options or {})}


class ServiceSession(SandboxSession):
    """One sandboxed service process, started at :meth:`start` (or taken from ``pool``).

    Args:
        isolation: the resolved sandbox backend.
        service: :func:`service_spec` of the module to run.
        binds: sandbox path -> host path, bound read-only (e.g. the database).
        pool: a :class:`WarmPool` started with the same service and binds.
    """

    def __init__(
        self,
        isolation: Isolation,
        *,
        service: Mapping[str, Any],
        binds: Mapping[str, str] | None = None,
        pool: WarmPool | None = None,
    ):
        super().__init__(isolation)
        self.service, self.binds, self._pool = dict(service), dict(binds or {}), pool

    async def start(self) -> None:
        """Start (or take from the pool) the service's sandbox.

        Raises :class:`~vt_envs.errors.SandboxUnavailableError`.
        """
        proc = self._pool.take() if self._pool is not None else None
        self._proc = proc or await SandboxProcess.start(
            self.isolation, mode="service", service=self.service, binds=self.binds
        )

    async def request(self, payload: Mapping[str, Any], timeout_s: float) -> Any:
        """The service's reply to ``payload``, within ``timeout_s`` seconds.

        Raises :class:`ServiceLost` (the process was killed; the next request
        starts a new one) or :class:`SessionClosed`.
        """
        return await self._serialized(lambda: self._request(dict(payload), timeout_s))

    async def _request(self, payload: dict[str, Any], timeout_s: float) -> Any:
        await self._ensure_started()
        try:
            return await self._proc.request(payload, timeout_s)
        except WorkerLost as lost:
            await self._proc.kill()
            raise ServiceLost(lost.kind, lost.detail) from None
