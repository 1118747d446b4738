"""The tool server: any registered env id's tools behind HTTP, with sessions per episode.

One :class:`ToolServer` per worker process (Starlette on uvicorn). A client
opens a session for ``(episode id, tool)`` naming the env id and keywords
whose tools it wants; the server builds that env once (its tools are then
shared by every session of that configuration, as in one local env) and
opens the tool's session for the task, gold left out. Then:

- **Leases**: every session expires ``lease_s`` after its last use (opening
  or a call); a reaper closes expired ones, so a client that died leaks
  nothing. Opening is idempotent per ``(episode, tool)``: a retried open gets
  the same session.
- **Deadlines**: each call runs under the caller's ``timeout_s``, enforced
  here as in a local env: the tool stops itself at the deadline; if it has
  not returned by deadline + its ``grace_s``, the call is cancelled and the
  session recovered before it takes another call.
- **Backpressure**: at most ``max_inflight`` calls run at once; a call past
  that is answered at once with 503 and ``Retry-After`` (nothing ran).
- **Auth**: a shared-secret bearer token, compared in constant time; every
  route but ``/health`` requires it. A server bound beyond loopback must
  have one.
- ``/health`` and ``/metrics`` (Prometheus text: sessions, calls by tool and
  outcome, a latency histogram, timeouts, rejections, reaped sessions,
  restarts of this worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vt_envs.core.tool import Tool, ToolResult, validate_arguments
from vt_envs.errors import InvalidConfigError
from vt_envs.server.protocol import decode_task, encode_result

__all__ = ["ToolServer", "create_app"]

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 120.0)
_UNWIND_S = 5.0  # how long a cancelled call may take to unwind


@dataclass
class _Session:
    id: str
    key: tuple[str, str]
    tool: Tool
    state: Any
    expires: float
    lock: asyncio.Lock | None
    busy: int = 0


@dataclass
class _Metrics:
    calls: Counter = field(default_factory=Counter)  # (tool, outcome) -> n
    latency: dict[str, list[int]] = field(default_factory=dict)  # tool -> bucket counts
    latency_sum: Counter = field(default_factory=Counter)
    opened: int = 0
    reaped: int = 0
    rejected: int = 0
    timeouts: int = 0
    recoveries: int = 0

    def observe(self, tool: str, outcome: str, seconds: float) -> None:
        self.calls[(tool, outcome)] += 1
        counts = self.latency.setdefault(tool, [0] * (len(LATENCY_BUCKETS) + 1))
        index = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), -1)
        counts[index] += 1
        self.latency_sum[tool] += seconds


class ToolServer:
    """Sessions of env tools (see the module docstring).

    Args:
        token: the shared secret clients send as ``Authorization: Bearer``;
            ``None`` accepts every caller (``vt-tool-server`` refuses to bind beyond
            loopback without one).
        max_inflight: calls running at once before new ones get 503.
        lease_s: a session's lifetime after its last use.
        workers: the base URLs of every worker of this server, for clients that
            spread sessions over them (``/v1/workers``); this one's by default.
        restarts: how many times this worker was restarted (for ``/metrics``).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        max_inflight: int = 256,
        lease_s: float = 300.0,
        workers: list[str] | None = None,
        restarts: int = 0,
    ):
        if max_inflight < 1:
            raise InvalidConfigError(f"max_inflight must be >= 1, got {max_inflight}")
        if lease_s <= 0:
            raise InvalidConfigError(f"lease_s must be > 0, got {lease_s}")
        self.token, self.max_inflight, self.lease_s = token, max_inflight, float(lease_s)
        self.workers, self.restarts = list(workers or []), restarts
        self.started = time.time()
        self.sessions: dict[str, _Session] = {}
        self._by_key: dict[tuple[str, str], str] = {}
        self._toolsets: dict[str, Any] = {}  # config key -> built env (its tools)
        self._building: dict[str, asyncio.Lock] = {}
        self._ids = itertools.count()
        self.inflight = 0
        self.metrics = _Metrics()
        self._reaper: asyncio.Task | None = None
        self._background: set[asyncio.Future] = set()

    # ----------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for session in list(self.sessions.values()):
            await self._close(session)
        for env in self._toolsets.values():
            with contextlib.suppress(Exception):
                await env.aclose()
        self._toolsets.clear()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(min(max(self.lease_s / 4, 0.05), 5.0))
            await self.reap()

    async def reap(self) -> int:
        """Close every session whose lease ran out (and is not in a call); how many."""
        now = time.monotonic()
        expired = [s for s in self.sessions.values() if s.expires < now and not s.busy]
        for session in expired:  # unlisted before any await: a call arriving now gets 404
            self._unlist(session)
        for session in expired:
            await self._release(session)
        self.metrics.reaped += len(expired)
        return len(expired)

    # ------------------------------------------------------------- sessions

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, given = (header or "").strip().partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def _toolset(self, env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
        key = json.dumps([env_id, env_kwargs], sort_keys=True)
        if key not in self._toolsets:
            lock = self._building.setdefault(key, asyncio.Lock())
            async with lock:
                if key not in self._toolsets:
                    import vt_envs

                    # Building may load data or an index: off the event loop.
                    env = await asyncio.to_thread(vt_envs.make, env_id, **env_kwargs)
                    self._toolsets[key] = env
        return self._toolsets[key]

    async def open(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Open (or find) the session of ``body["episode"]``'s tool ``body["tool"]``."""
        key = (str(body["episode"]), str(body["tool"]))
        if key in self._by_key and self._by_key[key] in self.sessions:
            session = self.sessions[self._by_key[key]]
            session.expires = time.monotonic() + self.lease_s
            return {"session": session.id, "lease_s": self.lease_s}
        env = await self._toolset(str(body["env_id"]), dict(body.get("env_kwargs") or {}))
        tool = env.tools.get(key[1])
        if tool is None:
            raise KeyError(f"{body['env_id']} has no tool {key[1]!r}; it has {list(env.tools)}")
        state = await tool.open_session(decode_task(body["task"]), seed=int(body.get("seed", 0)))
        if key in self._by_key and self._by_key[key] in self.sessions:  # opened meanwhile
            await tool.close_session(state)
            return {"session": self._by_key[key], "lease_s": self.lease_s}
        sid = f"{next(self._ids)}-{secrets.token_hex(8)}"
        lock = None if tool.concurrent_calls else asyncio.Lock()
        self.sessions[sid] = _Session(sid, key, tool, state, time.monotonic() + self.lease_s, lock)
        self._by_key[key] = sid
        self.metrics.opened += 1
        return {"session": sid, "lease_s": self.lease_s}

    async def call(self, sid: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Run one call; ``None`` when the session is unknown. Raises :class:`Busy`."""
        session = self.sessions.get(sid)
        if session is None:
            return None
        if self.inflight >= self.max_inflight:
            self.metrics.rejected += 1
            raise Busy
        self.inflight += 1
        session.busy += 1
        start = time.monotonic()
        try:
            async with session.lock if session.lock is not None else contextlib.nullcontext():
                result = await self._run(session, body)
        finally:
            self.inflight -= 1
            session.busy -= 1
            session.expires = time.monotonic() + self.lease_s
        outcome = "ok" if result.ok else (result.error or "error")
        self.metrics.observe(session.key[1], outcome, time.monotonic() - start)
        return encode_result(result)

    async def _run(self, session: _Session, body: Mapping[str, Any]) -> ToolResult:
        tool, arguments = session.tool, body.get("arguments") or {}
        problem = validate_arguments(tool.parameters, arguments)
        if problem is not None:
            return ToolResult.failure(f"Invalid arguments for {tool.name}: {problem}", "arguments")
        timeout = min(float(body.get("timeout_s", tool.timeout_s)), tool.timeout_s)
        running = asyncio.ensure_future(tool.call(session.state, arguments, timeout_s=timeout))
        try:
            done, _ = await asyncio.wait({running}, timeout=timeout + tool.grace_s)
        except BaseException:
            running.cancel()
            await asyncio.wait({running}, timeout=_UNWIND_S)
            raise
        if not done:  # the tool overran its own deadline: cancel it, make the session usable
            running.cancel()
            await asyncio.wait({running}, timeout=_UNWIND_S)
            self.metrics.timeouts += 1
            recovered = running.done()
            if recovered:
                try:
                    await asyncio.wait_for(tool.recover_session(session.state), tool.grace_s)
                    self.metrics.recoveries += 1
                except Exception:
                    recovered = False
            if not recovered:  # still running, or unrecoverable: no later call may share it
                self._unlist(session)
                closing = asyncio.ensure_future(tool.close_session(session.state))
                self._background.add(closing)  # kept until done (the loop holds weak refs)
                closing.add_done_callback(self._background.discard)
            return ToolResult.failure(
                f"{tool.name} did not finish within {timeout:.3g} s and was stopped.", "timeout"
            )
        try:
            result = running.result()
        except Exception as exc:  # a tool bug: an observation, and a log line here
            logger.exception("tool %s raised", tool.name)
            return ToolResult.failure(
                f"{tool.name} failed: {type(exc).__name__}: {exc}", "tool_server_error"
            )
        if result.error == "timeout":
            self.metrics.timeouts += 1
        return result

    async def close(self, sid: str) -> bool:
        session = self.sessions.get(sid)
        if session is None:
            return False
        await self._close(session)
        return True

    async def _close(self, session: _Session) -> None:
        if self._unlist(session):
            await self._release(session)

    def _unlist(self, session: _Session) -> bool:
        """Make ``session`` unknown to new requests; whether it was listed."""
        if self.sessions.pop(session.id, None) is None:
            return False
        self._by_key.pop(session.key, None)
        return True

    async def _release(self, session: _Session) -> None:
        """Close an unlisted session's tool state, after the call it may be in (bounded)."""
        if session.lock is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(session.lock.acquire(), _UNWIND_S + session.tool.grace_s)
        try:
            await session.tool.close_session(session.state)
        except Exception:
            logger.exception("closing a %s session failed", session.tool.name)

    # -------------------------------------------------------------- metrics

    def prometheus(self) -> str:
        m, lines = self.metrics, []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP vt_tool_server_{name} {help_text}",
                          f"# TYPE vt_tool_server_{name} {kind}"])  # fmt: skip
            lines.extend(f"vt_tool_server_{name}{labels} {value:g}" for labels, value in samples)

        metric("sessions", "gauge", "Open sessions.", [("", len(self.sessions))])
        metric("calls_in_flight", "gauge", "Calls running now.", [("", self.inflight)])
        metric("sessions_opened_total", "counter", "Sessions opened.", [("", m.opened)])
        metric("sessions_reaped_total", "counter", "Sessions closed by lease expiry.",
               [("", m.reaped)])  # fmt: skip
        calls = [(f'{{tool="{t}",outcome="{o}"}}', n) for (t, o), n in sorted(m.calls.items())]
        metric("calls_total", "counter", "Calls by tool and outcome.", calls)
        metric("timeouts_total", "counter", "Calls that hit their deadline.", [("", m.timeouts)])
        metric("rejected_total", "counter", "Calls refused with 503 (no free slot).",
               [("", m.rejected)])  # fmt: skip
        metric("session_recoveries_total", "counter", "Sessions recovered after an overrun.",
               [("", m.recoveries)])  # fmt: skip
        metric("worker_restarts_total", "counter", "Restarts of this worker process.",
               [("", self.restarts)])  # fmt: skip
        samples = []
        for tool, counts in sorted(m.latency.items()):
            running = 0
            for bound, count in zip([*LATENCY_BUCKETS, float("inf")], counts):
                running += count
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                samples.append((f'_bucket{{tool="{tool}",le="{le}"}}', running))
            samples.append((f'_sum{{tool="{tool}"}}', m.latency_sum[tool]))
            samples.append((f'_count{{tool="{tool}"}}', running))
        lines += ["# HELP vt_tool_server_call_seconds Call latency on the server.",
                  "# TYPE vt_tool_server_call_seconds histogram"]  # fmt: skip
        lines += [f"vt_tool_server_call_seconds{labels} {value:g}" for labels, value in samples]
        return "\n".join(lines) + "\n"


class Busy(Exception):
    """No free call slot (answered with 503)."""


def create_app(server: ToolServer) -> Any:
    """The Starlette app serving ``server``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    def guarded(handler):
        async def route(request: Request):
            if not server.authorized(request.headers.get("authorization")):
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            try:
                return await handler(request)
            except Busy:
                retry = {"Retry-After": "1"}
                return JSONResponse({"error": "busy"}, status_code=503, headers=retry)
            except (KeyError, ValueError, TypeError) as exc:
                return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)

        return route

    async def health(request: Request):
        return JSONResponse({"status": "ok", "sessions": len(server.sessions), "pid": os.getpid(),
                             "uptime_s": time.time() - server.started})  # fmt: skip

    async def metrics(request: Request):
        return PlainTextResponse(server.prometheus(), media_type="text/plain; version=0.0.4")

    async def workers(request: Request):
        return JSONResponse({"workers": server.workers})

    async def open_session(request: Request):
        return JSONResponse(await server.open(await request.json()))

    async def call(request: Request):
        answer = await server.call(request.path_params["sid"], await request.json())
        if answer is None:
            return JSONResponse({"error": "unknown session"}, status_code=404)
        return JSONResponse(answer)

    async def close_session(request: Request):
        closed = await server.close(request.path_params["sid"])
        return JSONResponse({"closed": closed}, status_code=200 if closed else 404)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", guarded(metrics)),
            Route("/v1/workers", guarded(workers)),
            Route("/v1/sessions", guarded(open_session), methods=["POST"]),
            Route("/v1/sessions/{sid}/call", guarded(call), methods=["POST"]),
            Route("/v1/sessions/{sid}", guarded(close_session), methods=["DELETE"]),
        ],
        lifespan=lifespan,
    )
