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

import asyncio
import importlib
import math
import os
import weakref
from collections.abc import Mapping
from typing import Any

from vt_envs.core.tool import check_timeout
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.process import SandboxProcess, WorkerLost
from vt_envs.sandbox.python_worker import WarmPool
from vt_envs.sandbox.session import SandboxSession, SessionClosed

__all__ = ["ServiceLost", "ServicePool", "ServiceSession", "SessionClosed", "service_spec"]


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

        At most :func:`start_slots` services of one event loop start at once;
        the others wait for a slot before theirs starts (and before its ready
        deadline runs). A start is mostly CPU (bubblewrap, an interpreter, its
        imports), and services start at an episode's reset, outside any call's
        deadline: 512 SQL workers starting together on two CPUs all passed
        their ready deadline; queued, they come up at the machine's pace.

        Raises :class:`~vt_envs.errors.SandboxUnavailableError`.
        """
        proc = self._pool.take() if self._pool is not None else None
        if proc is None:
            async with _start_slot():
                proc = await SandboxProcess.start(
                    self.isolation, mode="service", service=self.service, binds=self.binds
                )
        self._proc = proc

    @property
    def busy(self) -> bool:
        """A request is in flight."""
        return self._lock.locked()

    async def request(self, payload: Mapping[str, Any], timeout_s: float) -> Any:
        """The service's reply to ``payload``, within ``timeout_s`` seconds.

        Raises :class:`ServiceLost` (the process was killed; the next request
        starts a new one) or :class:`SessionClosed`; :class:`InvalidConfigError`
        (before anything is sent) when ``timeout_s`` is not a deadline.
        """
        timeout_s = check_timeout("timeout_s", timeout_s, limit=math.inf)
        return await self._serialized(lambda: self._request(dict(payload), timeout_s))

    async def _request(self, payload: dict[str, Any], timeout_s: float) -> Any:
        await self._ensure_started()
        try:
            return await self._proc.request(payload, timeout_s)
        except WorkerLost as lost:
            await self._proc.kill()
            raise ServiceLost(lost.kind, lost.detail) from None


class ServicePool:
    r"""Service processes kept between uses, one pool per set of binds.

    A user :meth:`acquire`\s a session for exclusive use and :meth:`release`\s
    it afterwards; a released session that is mid-request (its user was
    cancelled or closed early) is killed rather than handed to the next user.
    Sessions whose process died (a killed request) restart on their next request.

    Args:
        isolation: the resolved sandbox backend.
        service: :func:`service_spec` of the module.
        max_per_key: sessions per binds in use at once (``None``: no limit;
            :meth:`acquire` waits when the limit is reached).
        max_uses: a session is retired (its process stopped) after this many
            uses, bounding what one process accumulates.
        widen_binds: with ``n > 0``, an idle session may serve any binds it
            holds (a superset of those asked for), and when none does, a new
            session takes over the binds of the idle one idle longest (which is
            stopped) plus those asked for, up to ``n`` binds (past ``n``, or where
            sandbox paths clash, only those asked for). So a pool never holds more
            processes than it had users at once: one that serves several databases
            in turn converges on processes that bind them all, instead of keeping
            an idle process per database.
    """

    def __init__(
        self,
        isolation: Isolation,
        service: Mapping[str, Any],
        *,
        max_per_key: int | None = None,
        max_uses: int = 256,
        widen_binds: int = 0,
    ):
        if widen_binds and max_per_key is not None:
            raise InvalidConfigError("ServicePool: widen_binds and max_per_key do not combine")
        self.isolation, self.service = isolation, dict(service)
        self.max_per_key, self.max_uses = max_per_key, max_uses
        self.widen_binds = widen_binds
        # Idle sessions, the one idle longest first (each with its binds' key).
        self._idle: list[tuple[tuple, ServiceSession]] = []
        self._count: dict[tuple, int] = {}
        self._uses: dict[int, int] = {}
        self._changed: asyncio.Condition | None = None
        self._closed = False

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _take_idle(self, binds: Mapping[str, str]) -> ServiceSession | None:
        """Pop an idle session that holds ``binds`` (exactly, or widened: any superset)."""
        key = _key(binds)
        for i, (idle_key, session) in enumerate(self._idle):
            if idle_key == key or (self.widen_binds and binds.items() <= session.binds.items()):
                del self._idle[i]
                return session
        return None

    async def acquire(self, binds: Mapping[str, str]) -> ServiceSession:
        """A session for ``binds``, idle or new (its process starts on first request)."""
        binds, replaced = dict(binds), None
        async with self._condition():
            while True:
                if self._closed:
                    raise SessionClosed
                session = self._take_idle(binds)
                if session is not None:
                    return session
                if self.widen_binds and self._idle:
                    _, replaced = self._idle.pop(0)
                    self._forget(replaced)
                    wider = {**replaced.binds, **binds}
                    clash = any(replaced.binds.get(k, v) != v for k, v in binds.items())
                    if not clash and len(wider) <= self.widen_binds:
                        binds = wider
                key = _key(binds)
                if self.max_per_key is None or self._count.get(key, 0) < self.max_per_key:
                    self._count[key] = self._count.get(key, 0) + 1
                    session = ServiceSession(self.isolation, service=self.service, binds=binds)
                    break
                await self._condition().wait()
        if replaced is not None:
            await replaced.close()
        return session

    def _forget(self, session: ServiceSession) -> None:
        key = _key(session.binds)
        self._uses.pop(id(session), None)
        self._count[key] = self._count.get(key, 1) - 1

    async def release(self, session: ServiceSession) -> None:
        """Give ``session`` back (or retire it: busy, closed, or used ``max_uses`` times)."""
        uses = self._uses.get(id(session), 0) + 1
        retire = self._closed or session.busy or session.closed or uses >= self.max_uses
        if retire:
            self._uses.pop(id(session), None)
            await session.close()
        else:
            self._uses[id(session)] = uses
        async with self._condition():
            if retire:
                key = _key(session.binds)
                self._count[key] = self._count.get(key, 1) - 1
            else:
                self._idle.append((_key(session.binds), session))
            self._condition().notify()

    async def aclose(self) -> None:
        """Stop every idle session; sessions in use stop when released. Idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(s.close() for _, s in idle), return_exceptions=True)


def start_slots() -> int:
    """How many services one event loop starts at once: twice the CPUs, at least 4."""
    return max(4, 2 * (os.cpu_count() or 1))


_START_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _start_slot() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _START_SLOTS.get(loop)
    if slots is None:
        slots = _START_SLOTS[loop] = asyncio.Semaphore(start_slots())
    return slots


def _key(binds: Mapping[str, str]) -> tuple:
    return tuple(sorted(binds.items()))
