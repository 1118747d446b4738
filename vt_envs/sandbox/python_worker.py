"""The persistent, sandboxed Python interpreter of one episode (host side).

A :class:`PythonWorker` runs code like a notebook cell: one namespace that
persists across calls, stdout/stderr captured, and the ``repr`` of a final
expression returned. When a call times out, crashes the interpreter, or calls
``sys.exit``/``os._exit``, the sandbox is killed and a fresh one started, and
the outcome says ``restarted=True`` so the agent can be told its state is gone.

``mode="fork"`` gives fresh state per call instead: the warm worker forks a
child for each call and the child's namespace dies with it.

:class:`WarmPool` keeps started workers ready so an episode's start-up is a
hand-over instead of a sandbox launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

from vt_envs.core.loop import keep_running
from vt_envs.core.tool import check_timeout
from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.process import Captured, SandboxProcess, WorkerLost, _encode_files
from vt_envs.sandbox.session import SandboxSession, SessionClosed

__all__ = ["PYTHON_MODES", "PythonOutcome", "PythonWorker", "WarmPool"]

PYTHON_MODES = ("persistent", "fork")


@dataclass(frozen=True)
class PythonOutcome:
    """What one call produced.

    Attributes:
        status: ``"ok"``, ``"error"`` (the code raised; ``kind`` is
            ``"exception"`` or ``"syntax_error"``), ``"timeout"``,
            ``"crashed"`` (the interpreter died), ``"exit"`` (``sys.exit``)
            or ``"closed"`` (the session was closed; nothing ran).
        restarted: the sandbox was replaced and all state was lost.
        lingering_threads: threads the call started that were still running
            when it returned (their output may show up in later calls).
    """

    status: str
    stdout: Captured
    stderr: Captured
    value: str | None = None
    kind: str | None = None
    exc_type: str | None = None
    message: str = ""
    traceback: str = ""
    restarted: bool = False
    elapsed_s: float = 0.0
    lingering_threads: int = 0

    @property
    def truncated(self) -> bool:
        return self.stdout.truncated or self.stderr.truncated


class WarmPool:
    """Started sandboxes waiting for an episode, refilled in the background.

    ``start_options`` are :meth:`SandboxProcess.start`'s keywords (``mode``,
    ``python_mode``, ``service``, ``binds``...), the same for every sandbox.
    Bound to the event loop it first runs on (pipes belong to a loop); on a
    different loop it starts nothing and hands nothing out.

    With ``recycled > 0`` (and ``recycle=True`` in ``start_options``), an
    episode's sandbox is given back at its end (:meth:`give_back`) and, once
    recycled (as fresh: see :meth:`SandboxProcess.recycle`), kept for the next
    episode, up to ``recycled`` of them besides the ``size`` prestarted ones.
    """

    def __init__(self, isolation: Isolation, *, size: int, recycled: int = 0, **start_options: Any):
        self.isolation, self.size, self.recycled = isolation, size, recycled
        self.start_options = {"mode": "python", **start_options}
        self._ready: list[SandboxProcess] = []
        self._recycling = 0  # sandboxes given back and being recycled now
        self._filling: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _same_loop(self) -> bool:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        return self._loop is loop

    def fill(self) -> None:
        """Start sandboxes in the background until ``size`` are ready or starting."""
        if not self._same_loop() or self._closed:
            return
        started = False
        while len(self._ready) + len(self._filling) < self.size:
            task = asyncio.ensure_future(self._start_one())
            self._filling.add(task)
            task.add_done_callback(self._filling.discard)
            started = True
        if started:  # the refill must go on while the caller is between sync calls
            keep_running()

    async def _start_one(self) -> None:
        with contextlib.suppress(Exception):  # a failed prestart just means a cold start later
            proc = await SandboxProcess.start(self.isolation, **self.start_options)
            self._ready.append(proc)

    def take(self) -> SandboxProcess | None:
        """A ready sandbox (the latest recycled first), or ``None``; schedules a
        refill either way."""
        if not self._same_loop() or self._closed:
            return None
        proc = None
        while self._ready and proc is None:
            candidate = self._ready.pop()
            proc = candidate if candidate.alive else None
        self.fill()
        return proc

    async def give_back(self, proc: SandboxProcess) -> None:
        """Recycle an episode's sandbox for the next one (or kill it: no room, not
        recyclable, not answering, another loop, the pool closed). Room counts the
        sandboxes being recycled now, so episodes ending together keep no more than
        the pool holds."""
        kept = len(self._ready) + self._recycling
        room = kept < self.size + self.recycled and not self._closed
        if room and self._same_loop():
            self._recycling += 1
            try:
                if await proc.recycle() and not self._closed:
                    self._ready.append(proc)
                    return
            except BaseException:
                await asyncio.shield(proc.kill())
                raise
            finally:
                self._recycling -= 1
        await proc.kill()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._filling):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._filling, return_exceptions=True)
        ready, self._ready = self._ready, []
        for proc in ready:
            await proc.kill()


class PythonWorker(SandboxSession):
    """One episode's interpreter. ``await start()``, ``await run(...)``, ``await close()``.

    ``random`` inside is seeded with ``seed`` before the first call, and
    ``PYTHONHASHSEED`` is fixed in every sandbox, so a seeded episode prints
    the same sets, dicts of strings and random numbers in every run.
    """

    def __init__(
        self,
        isolation: Isolation,
        *,
        files: dict[str, str | bytes] | None = None,
        mode: str = "persistent",
        max_repr_chars: int = 10_000,
        pool: WarmPool | None = None,
        seed: int = 0,
    ):
        if mode not in PYTHON_MODES:
            raise ValueError(f"mode must be one of {PYTHON_MODES}, got {mode!r}")
        super().__init__(isolation, files=files, seed=seed)
        self.mode = mode
        self.max_repr_chars = max_repr_chars
        self._pool = pool
        self._pending_files = False
        self._pending_seed = True

    async def start(self) -> None:
        """Start (or take from the pool) the sandbox. Raises ``SandboxUnavailableError``."""
        proc = self._pool.take() if self._pool is not None else None
        if proc is None:
            proc = await SandboxProcess.start(
                self.isolation,
                mode="python",
                files=self.files,
                python_mode=self.mode,
                max_repr_chars=self.max_repr_chars,
                recycle=self._pool is not None and self._pool.recycled > 0,
            )
            self._pending_files = False
        else:
            self._pending_files = bool(self.files)
        self._proc, self._pending_seed = proc, True

    async def close(self) -> None:
        """End the episode: its sandbox goes back to a recycling pool (recycled as
        fresh for a later episode) or is killed. Idempotent; later calls are refused."""
        if self._closed:
            return
        self._closed = True
        proc, pool = self._proc, self._pool
        if proc is None:
            return
        if pool is None or pool.recycled == 0 or self._lock.locked():
            await proc.kill()  # (mid-call: the call's own unwinding kills it as well)
            return
        await pool.give_back(proc)

    async def run(self, code: str, timeout_s: float) -> PythonOutcome:
        """Run ``code``; never raises for anything the code does (a ``timeout_s`` that
        is not a deadline raises :class:`InvalidConfigError`, before anything runs)."""
        timeout_s = check_timeout("timeout_s", timeout_s, limit=math.inf)
        try:
            return await self._serialized(lambda: self._run(code, timeout_s))
        except SessionClosed:
            empty = Captured(b"", 0)
            return PythonOutcome("closed", empty, empty, message="the session is closed")

    async def _run(self, code: str, timeout_s: float) -> PythonOutcome:
        await self._ensure_started()
        request: dict = {"code": code}
        if self._pending_files:
            request["files"] = _encode_files(self.files)
            self._pending_files = False
        if self._pending_seed:
            request["seed"] = self.seed
            self._pending_seed = False
        start = time.perf_counter()
        try:
            reply, out, err = await self._proc.execute(request, timeout_s)
            _check_reply(reply)
        except WorkerLost as lost:
            out, err = self._proc.stdout.snapshot(), self._proc.stderr.snapshot()
            await self._restart()
            return PythonOutcome(
                lost.kind,
                out,
                err,
                message=lost.detail,
                restarted=True,
                elapsed_s=time.perf_counter() - start,
            )
        elapsed = time.perf_counter() - start
        status = reply.get("status", "crashed")
        restarted = status in ("exit", "crashed")
        if restarted:
            await self._restart()
        return PythonOutcome(
            status=status,
            stdout=out,
            stderr=err,
            value=reply.get("value"),
            kind=reply.get("kind"),
            exc_type=reply.get("exc_type"),
            message=reply.get("message", reply.get("code", "")),
            traceback=reply.get("traceback", ""),
            restarted=restarted,
            elapsed_s=elapsed,
            lingering_threads=reply.get("lingering_threads", 0),
        )


_STATUSES = frozenset({"ok", "error", "exit", "crashed"})
_TEXT_FIELDS = ("value", "kind", "exc_type", "message", "traceback", "code")


def _check_reply(reply: dict) -> None:
    """Raise :class:`WorkerLost` unless ``reply`` has the worker's reply schema.

    The worker runs the model's code in its own interpreter, so its replies
    are untrusted: a wrong field is a crashed worker, not an exception.
    """
    if reply.get("status") not in _STATUSES:
        raise WorkerLost("crashed", f"protocol violation: status {reply.get('status')!r}")
    for key in _TEXT_FIELDS:
        if reply.get(key) is not None and not isinstance(reply[key], str):
            raise WorkerLost("crashed", f"protocol violation: {key} is not a string")
    threads = reply.get("lingering_threads", 0)
    if type(threads) is not int or threads < 0:
        raise WorkerLost("crashed", "protocol violation: lingering_threads")
