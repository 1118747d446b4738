"""The tool server: an operator's env tools behind HTTP, with sessions per episode.

One :class:`ToolServer` per worker process (Starlette on uvicorn). What it
serves is fixed by its operator (:class:`~vt_envs.server.config.ServerConfig`):
the env ids, their tools and every keyword that configures them. A client
opens a session for ``(episode id, tool)`` naming a served env id, the
keywords its operator lets clients choose (``split``...) and a task *by id*;
the server builds that env once (its tools are then shared by every session
of that configuration, as in one local env), finds the task in the env's own
task source, checks the client's prompt digest against it, and opens the
tool's session. Nothing a client sends reaches a tool but the task id and the
call's arguments. Then:

- **Auth**: a shared-secret bearer token, compared in constant time, on every
  route and every interface, loopback included (only an explicit
  ``insecure_no_token`` serves without one). ``/health`` answers anyone, and
  tells only ``{"status": "ok"}`` without the token.
- **Leases**: every session expires ``lease_s`` after its last use (opening
  or a call); a reaper closes expired ones, so a client that died leaks
  nothing. Opening is idempotent per ``(episode, tool)``: a retried open gets
  the same session.
- **Deadlines**: each call runs under the caller's ``timeout_s`` (a finite
  number > 0, at most the tool's own), enforced here as in a local env: the
  tool stops itself at the deadline; if it has not returned by deadline + its
  ``grace_s``, the call is cancelled and the session recovered before it takes
  another call.
- **Caps**: sessions in all and per client address (429), distinct built
  configurations (429), request body size (413) and the time its headers and
  body may take to arrive (closed / 408), connections (uvicorn's 503).
- **Load shedding**: at most ``max_inflight`` calls run at once, and while the
  event loop lags more than ``shed_lag_s`` behind (the worker cannot keep up),
  new calls are answered at once with 503 and ``Retry-After`` (nothing ran; the
  client retries within the call's deadline) instead of queueing into their
  deadlines.
- ``/health`` and ``/metrics`` (Prometheus text: sessions, calls by tool and
  outcome, a latency histogram, timeouts, rejections and refusals, reaped
  sessions, event-loop lag, restarts of this worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import json
import logging
import math
import os
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vt_envs.core.tool import Tool, ToolResult, validate_arguments
from vt_envs.errors import InvalidConfigError
from vt_envs.server.config import Refused, ServerConfig
from vt_envs.tools.remote.protocol import encode_result, prompt_digest

__all__ = ["Busy", "ToolServer", "create_app"]

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 120.0)
_UNWIND_S = 5.0  # how long a cancelled call may take to unwind
_LAG_PROBE_S = 0.05  # how often the event loop's lag is sampled
_MAX_ID_CHARS = 256  # episode ids, tool names, task ids
_BUILD_THREADS = 2  # the server's own pool for env builds and task lookups
_MAX_QUEUED = 16  # jobs that may wait for it before new ones get 503
_MIN_TOKEN_CHARS = 16


@dataclass
class _Session:
    id: str
    key: tuple[str, str]
    tool: Tool
    state: Any
    expires: float
    lock: asyncio.Lock | None
    client: str = ""
    config: str = ""  # the key of the built configuration it belongs to
    busy: int = 0


@dataclass
class _Metrics:
    calls: Counter = field(default_factory=Counter)  # (tool, outcome) -> n
    latency: dict[str, list[int]] = field(default_factory=dict)  # tool -> bucket counts
    latency_sum: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)  # HTTP status -> n
    opened: int = 0
    reaped: int = 0
    rejected: int = 0
    shed: int = 0
    write_timeouts: int = 0
    timeouts: int = 0
    recoveries: int = 0

    def observe(self, tool: str, outcome: str, seconds: float) -> None:
        self.calls[(tool, outcome)] += 1
        counts = self.latency.setdefault(tool, [0] * (len(LATENCY_BUCKETS) + 1))
        index = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), -1)
        counts[index] += 1
        self.latency_sum[tool] += seconds


class Busy(Refused):
    """No free call slot, or the worker is shedding load (answered with 503)."""

    def __init__(self, reason: str = "busy", retry_after_s: float = 1.0):
        super().__init__(503, reason, retry_after_s=retry_after_s)


class ToolServer:
    """Sessions of an operator's env tools (see the module docstring).

    Args:
        config: what is served and the limits (default: every registered env id
            whose tools can be remote, each with its declared client keywords).
        token: the shared secret clients send as ``Authorization: Bearer``.
        insecure_no_token: serve without a token (local experiments only: any
            local user can then run calls); required to pass ``token=None``.
        workers: the base URLs of every worker of this server, for clients that
            spread sessions over them (``/v1/workers``); this one's by default.
        restarts: how many times this worker was restarted (for ``/metrics``).

    Raises:
        InvalidConfigError: no token and no ``insecure_no_token``.
    """

    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        token: str | None = None,
        insecure_no_token: bool = False,
        workers: list[str] | None = None,
        restarts: int = 0,
    ):
        if not token and not insecure_no_token:
            raise InvalidConfigError(
                "a tool server needs a token (clients send it as a bearer token; set "
                "$VT_TOOL_SERVER_TOKEN or pass --token-file); to serve without one on "
                "loopback for a local experiment, pass insecure_no_token=True "
                "(--insecure-no-token)"
            )
        if token and len(token) < _MIN_TOKEN_CHARS:
            raise InvalidConfigError(
                f"the token has {len(token)} characters; use at least {_MIN_TOKEN_CHARS} "
                'random ones (python -c "import secrets; print(secrets.token_hex(16))")'
            )
        self.config = config or ServerConfig.build()
        self.limits = self.config.limits
        self.token = token or None
        self.lease_s, self.max_inflight = self.limits.lease_s, self.limits.max_inflight
        self.workers, self.restarts = list(workers or []), restarts
        self.started = time.time()
        self.sessions: dict[str, _Session] = {}
        self._by_key: dict[tuple[str, str], str] = {}
        self._per_client: Counter = Counter()  # client address -> sessions (and opening)
        self._opening = 0  # sessions being opened now
        self._toolsets: dict[str, Any] = {}  # config key -> built env, least recent first
        self._building: dict[str, asyncio.Lock] = {}
        self._pool = ThreadPoolExecutor(_BUILD_THREADS, thread_name_prefix="vt-tool-server")
        self._offloaded = 0  # jobs on (or waiting for) the pool
        self._ids = itertools.count()
        self.inflight = 0
        self.lag_s = 0.0  # the event loop's recent lag (see _watch_lag)
        self.metrics = _Metrics()
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Future] = set()

    # ----------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._reap_forever()),
                       asyncio.create_task(self._watch_lag())]  # fmt: skip

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for session in list(self.sessions.values()):
            await self._close(session)
        for env in self._toolsets.values():
            with contextlib.suppress(Exception):
                await env.aclose()
        self._toolsets.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(min(max(self.lease_s / 4, 0.05), 5.0))
            await self.reap()

    async def _watch_lag(self) -> None:
        """Sample how late the loop wakes a sleeper: a loop that cannot keep up with its
        requests wakes it late. ``lag_s`` jumps up at once and decays over ~1 s, so a
        burst of load sheds calls until the loop has caught up."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(_LAG_PROBE_S)
            late = max(loop.time() - before - _LAG_PROBE_S, 0.0)
            self.lag_s = max(late, self.lag_s * 0.8)

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

    async def _offload(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on this server's own small pool (builds and task lookups can take
        long, and a thread cannot be stopped): past ``_MAX_QUEUED`` waiting jobs, 503."""
        if self._offloaded >= _BUILD_THREADS + _MAX_QUEUED:
            raise Busy("the server is busy building envs and resolving tasks", 2.0)
        self._offloaded += 1
        try:
            call = functools.partial(fn, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        finally:
            self._offloaded -= 1

    async def _toolset(self, env_id: str, kwargs: Mapping[str, Any]) -> tuple[str, Any]:
        """``(config key, built env)`` for these keywords, built once and kept while used;
        past ``max_env_configs`` the least recently used unused one is closed, else 429."""
        key = json.dumps([env_id, kwargs], sort_keys=True)
        if key not in self._toolsets:
            lock = self._building.setdefault(key, asyncio.Lock())
            try:
                async with lock:
                    if key not in self._toolsets:
                        await self._make_room_for_a_config(key)
                        self._toolsets[key] = await self._build(env_id, kwargs)
            finally:
                self._building.pop(key, None)
        self._toolsets[key] = self._toolsets.pop(key)  # most recently used last
        return key, self._toolsets[key]

    async def _make_room_for_a_config(self, key: str) -> None:
        building = len(set(self._building) - {key})  # others being built now
        while len(self._toolsets) + building >= self.limits.max_env_configs:
            in_use = {session.config for session in self.sessions.values()}
            idle = next((k for k in self._toolsets if k not in in_use), None)  # LRU first
            if idle is None:
                raise Refused(
                    429,
                    f"this server keeps at most {self.limits.max_env_configs} built "
                    "configurations (env id + client keywords), all in use",
                    retry_after_s=5.0,
                )
            with contextlib.suppress(Exception):
                await self._toolsets.pop(idle).aclose()

    async def _build(self, env_id: str, kwargs: Mapping[str, Any]) -> Any:
        """The tools and task source of ``env_id`` for these keywords: only those of a
        declared domain (:meth:`~vt_envs.core.domain.Domain.toolset`); a plain
        builder's whole env (whose tools the server then serves)."""
        import vt_envs

        build = vt_envs.registration.builder_of(env_id)
        toolset = getattr(build, "toolset", None)
        try:
            if toolset is not None:
                return await self._offload(toolset, **kwargs)
            env = await self._offload(vt_envs.make, env_id, **kwargs)
        except Refused:
            raise
        except Exception as exc:  # the client's values (the operator's were checked at start)
            logger.warning("building %s with %s failed: %r", env_id, kwargs, exc)
            raise Refused(400, f"{env_id} cannot be built with {kwargs}: "
                               f"{type(exc).__name__}: {exc}"[:1000]) from None  # fmt: skip
        if getattr(env, "verifier", None) is not None and env.verifier.reads_tools:
            await env.aclose()
            raise Refused(403, f"{env_id}'s tools cannot be served remotely")
        return env

    async def open(self, body: Any, client: str = "") -> dict[str, Any]:
        """Open (or find) the session of ``body["episode"]``'s tool ``body["tool"]``.

        Raises:
            Refused: a malformed request (400), an env id, keyword or tool the operator
                does not serve (403), a task the env does not have (422) or has with
                another prompt (409), no room for a session or a configuration (429).
        """
        if not isinstance(body, Mapping):
            raise Refused(400, "the request must be a JSON object")
        key = (_name(body, "episode"), _name(body, "tool"))
        if key in self._by_key and self._by_key[key] in self.sessions:
            session = self.sessions[self._by_key[key]]
            session.expires = time.monotonic() + self.lease_s
            return {"session": session.id, "lease_s": self.lease_s}
        # What is malformed or not served is refused before capacity is even looked at.
        served = self.config.served(body.get("env_id"))
        if served.tools is not None and key[1] not in served.tools:
            raise Refused(403, f"this server serves {sorted(served.tools)} of {served.id}, "
                               f"not {key[1]!r}")  # fmt: skip
        kwargs = served.build_kwargs(body.get("env_kwargs"))
        ref = _task_ref(body.get("task"))
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise Refused(400, f"seed must be an integer, got {seed!r:.40}")
        self._check_room(client)
        config, env = await self._toolset(served.id, kwargs)
        tool = env.tools.get(key[1])
        if tool is None:
            raise Refused(403, f"{served.id} has no tool {key[1]!r}; it has {sorted(env.tools)}")
        task = await self._task(env, served.id, ref)
        self._check_room(client)  # again: other opens may have filled it meanwhile
        self._opening += 1  # a slot held while the session opens, so concurrent opens
        self._per_client[client] += 1  # cannot all pass the check and overfill the caps
        try:
            state = await tool.open_session(task, seed=seed)
        except BaseException:
            self._release_slot(client)
            raise
        self._opening -= 1
        if key in self._by_key and self._by_key[key] in self.sessions:  # opened meanwhile
            self._release_slot(client, opening=False)
            await tool.close_session(state)
            return {"session": self._by_key[key], "lease_s": self.lease_s}
        sid = f"{next(self._ids)}-{secrets.token_hex(8)}"
        lock = None if tool.concurrent_calls else asyncio.Lock()
        expires = time.monotonic() + self.lease_s
        self.sessions[sid] = _Session(sid, key, tool, state, expires, lock, client, config)
        self._by_key[key] = sid
        self.metrics.opened += 1
        return {"session": sid, "lease_s": self.lease_s}

    def _release_slot(self, client: str, *, opening: bool = True) -> None:
        self._opening -= opening
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    def _check_room(self, client: str) -> None:
        limits = self.limits
        if len(self.sessions) + self._opening >= limits.max_sessions:
            raise Refused(429, f"this server holds its most sessions ({limits.max_sessions})",
                          retry_after_s=5.0)  # fmt: skip
        if self._per_client[client] >= limits.max_sessions_per_client:
            raise Refused(
                429,
                f"this client ({client or 'unknown'}) holds its most sessions "
                f"({limits.max_sessions_per_client}); close finished episodes' sessions",
                retry_after_s=5.0,
            )

    async def _task(self, env: Any, env_id: str, ref: Mapping[str, str]) -> Any:
        """The task ``ref`` names, from ``env``'s own task source (never the client's)."""
        task_id = ref["id"]
        try:
            # Only what the source resolves directly (a client's id never makes a generated
            # source generate itself whole), off the loop: making one task may take a while.
            task = await self._offload(env.tasks.find, task_id, scan=False)
        except Refused:
            raise
        except Exception as exc:
            raise Refused(400, f"{env_id}'s task {task_id!r} could not be made: "
                               f"{type(exc).__name__}") from None  # fmt: skip
        if task is None:
            raise Refused(
                422,
                f"{env_id} on this server has no task {task_id!r} (in {env.tasks.name}/"
                f"{env.tasks.split}); tasks given inline cannot run on a tool server",
            )
        if prompt_digest(str(task.prompt)) != ref["prompt_sha256"]:
            raise Refused(
                409,
                f"task {task_id!r} on this server has another prompt than the client's: "
                f"the two built {env_id} from different data, keywords or versions",
            )
        return task

    async def call(self, sid: str, body: Any) -> dict[str, Any] | None:
        """Run one call; ``None`` when the session is unknown. Raises :class:`Busy`
        (503: nothing ran) and :class:`Refused` (400: a malformed request)."""
        session = self.sessions.get(sid)
        if session is None:
            return None
        if not isinstance(body, Mapping):
            raise Refused(400, "the request must be a JSON object")
        timeout = _deadline(body.get("timeout_s", session.tool.timeout_s))
        arguments = body.get("arguments") or {}
        if not isinstance(arguments, Mapping):
            raise Refused(400, f"arguments must be a JSON object, got {type(arguments).__name__}")
        if self.inflight >= self.max_inflight:
            self.metrics.rejected += 1
            raise Busy(f"all {self.max_inflight} call slots are in use")
        if self.lag_s > self.limits.shed_lag_s:
            self.metrics.shed += 1
            raise Busy(f"the worker is {self.lag_s:.2g} s behind; shedding load",
                       retry_after_s=min(max(self.lag_s, 0.5), 5.0))  # fmt: skip
        self.inflight += 1
        session.busy += 1
        start = time.monotonic()
        try:
            async with session.lock if session.lock is not None else contextlib.nullcontext():
                result = await self._run(session, arguments, timeout)
        finally:
            self.inflight -= 1
            session.busy -= 1
            session.expires = time.monotonic() + self.lease_s
        outcome = "ok" if result.ok else (result.error or "error")
        self.metrics.observe(session.key[1], outcome, time.monotonic() - start)
        return encode_result(result)

    async def _run(
        self, session: _Session, arguments: Mapping[str, Any], timeout_s: float
    ) -> ToolResult:
        tool = session.tool
        problem = validate_arguments(tool.parameters, arguments)
        if problem is not None:
            return ToolResult.failure(f"Invalid arguments for {tool.name}: {problem}", "arguments")
        timeout = min(timeout_s, tool.timeout_s)  # a client may shorten a deadline, never extend
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
        self._release_slot(session.client, opening=False)
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

    def describe(self) -> dict[str, Any]:
        """What this server serves (``/v1/envs``): env ids, tools, client keywords."""
        return {
            "envs": {
                env.id: {
                    "client_kwargs": sorted(env.client_kwargs),
                    "fixed_kwargs": sorted(env.kwargs),
                    "tools": None if env.tools is None else sorted(env.tools),
                }
                for env in self.config.envs.values()
            }
        }

    # -------------------------------------------------------------- metrics

    def prometheus(self) -> str:
        m, lines = self.metrics, []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP vt_tool_server_{name} {help_text}",
                          f"# TYPE vt_tool_server_{name} {kind}"])  # fmt: skip
            lines.extend(f"vt_tool_server_{name}{labels} {value:g}" for labels, value in samples)

        metric("sessions", "gauge", "Open sessions.", [("", len(self.sessions))])
        metric("calls_in_flight", "gauge", "Calls running now.", [("", self.inflight)])
        metric("event_loop_lag_seconds", "gauge", "Recent event-loop lag.", [("", self.lag_s)])
        metric("sessions_opened_total", "counter", "Sessions opened.", [("", m.opened)])
        metric("sessions_reaped_total", "counter", "Sessions closed by lease expiry.",
               [("", m.reaped)])  # fmt: skip
        calls = [(f'{{tool="{t}",outcome="{o}"}}', n) for (t, o), n in sorted(m.calls.items())]
        metric("calls_total", "counter", "Calls by tool and outcome.", calls)
        metric("timeouts_total", "counter", "Calls that hit their deadline.", [("", m.timeouts)])
        metric("rejected_total", "counter", "Calls refused with 503 (no free slot).",
               [("", m.rejected)])  # fmt: skip
        metric("shed_total", "counter", "Calls refused with 503 (the loop lagged).",
               [("", m.shed)])  # fmt: skip
        metric("write_timeouts_total", "counter", "Connections dropped: the client did not "
               "read a reply.", [("", m.write_timeouts)])  # fmt: skip
        refused = [(f'{{status="{c}"}}', n) for c, n in sorted(m.refused.items())]
        metric("refused_total", "counter", "Requests refused, by HTTP status.", refused)
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


def _name(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID_CHARS:
        raise Refused(400, f"{key} must be a string of 1 to {_MAX_ID_CHARS} characters")
    return value


def _task_ref(ref: Any) -> Mapping[str, str]:
    if not isinstance(ref, Mapping) or set(ref) != {"id", "prompt_sha256"}:
        raise Refused(
            400,
            "task must be a reference {id, prompt_sha256}: the server runs the tasks of "
            "its own task sources, never assets or paths a client sends",
        )
    _name(ref, "id")
    if not isinstance(ref["prompt_sha256"], str) or len(ref["prompt_sha256"]) != 64:
        raise Refused(400, "task.prompt_sha256 must be a sha256 hex digest")
    return ref


def _deadline(value: Any) -> float:
    """A call's ``timeout_s``: a finite number of seconds > 0 (never NaN: a NaN deadline
    compares false with everything and would never fire)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(400, f"timeout_s must be a number of seconds, got {value!r:.40}")
    try:
        seconds = float(value)
    except OverflowError:  # an int past a float's range
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise Refused(400, f"timeout_s must be finite and > 0, got {seconds!r}")
    return seconds


def create_app(server: ToolServer) -> Any:
    """The ASGI app serving ``server``: Starlette routes inside a guard that bounds each
    request's body size and read time (:class:`BoundedRequests`)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    def refusal(exc: Refused) -> JSONResponse:
        server.metrics.refused[exc.status] += 1
        headers = {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
        return JSONResponse({"error": exc.reason}, status_code=exc.status, headers=headers)

    def guarded(handler):
        async def route(request: Request):
            if not server.authorized(request.headers.get("authorization")):
                server.metrics.refused[401] += 1
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            try:
                return await handler(request)
            except Refused as exc:
                return refusal(exc)
            except Exception:  # a server bug: logged here, no traceback for the client
                logger.exception("%s %s failed", request.method, request.url.path)
                return JSONResponse({"error": "internal error"}, status_code=500)

        return route

    async def body(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
            raise Refused(400, f"the request body is not JSON: {type(exc).__name__}") from None

    async def health(request: Request):
        if server.token is not None and not server.authorized(request.headers.get("authorization")):
            return JSONResponse({"status": "ok"})  # alive, and nothing more to strangers
        return JSONResponse({"status": "ok", "sessions": len(server.sessions), "pid": os.getpid(),
                             "uptime_s": time.time() - server.started})  # fmt: skip

    async def metrics(request: Request):
        return PlainTextResponse(server.prometheus(), media_type="text/plain; version=0.0.4")

    async def workers(request: Request):
        return JSONResponse({"workers": server.workers})

    async def envs(request: Request):
        return JSONResponse(server.describe())

    async def open_session(request: Request):
        client = request.client.host if request.client else ""
        return JSONResponse(await server.open(await body(request), client))

    async def call(request: Request):
        answer = await server.call(request.path_params["sid"], await body(request))
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

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", guarded(metrics)),
            Route("/v1/workers", guarded(workers)),
            Route("/v1/envs", guarded(envs)),
            Route("/v1/sessions", guarded(open_session), methods=["POST"]),
            Route("/v1/sessions/{sid}/call", guarded(call), methods=["POST"]),
            Route("/v1/sessions/{sid}", guarded(close_session), methods=["DELETE"]),
        ],
        lifespan=lifespan,
    )
    return BoundedRequests(app, server)


class BoundedRequests:
    """ASGI middleware bounding each request's body (the server's limits): reads it
    whole before the app sees it, refusing one larger than ``max_body_bytes`` (413, also
    when ``Content-Length`` says so) or slower than ``read_timeout_s`` to arrive (408),
    then replays it to the app. (Headers and writes are bounded by the connection's
    protocol: :func:`vt_envs.server.cli.bounded_protocol`.)"""

    def __init__(self, app: Any, server: ToolServer):
        self.app, self.server = app, server
        limits = server.limits
        self.max_body_bytes, self.read_timeout_s = limits.max_body_bytes, limits.read_timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            return await self._refuse(send, 413, "the request body is too large")
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.read_timeout_s
        more = True
        while more:
            left = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.0))
            except asyncio.TimeoutError:
                return await self._refuse(send, 408, "the request body arrived too slowly")
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return await self._refuse(send, 413, "the request body is too large")
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await self.app(scope, replay, send)

    async def _refuse(self, send: Any, status: int, reason: str) -> None:
        self.server.metrics.refused[status] += 1
        payload = json.dumps({"error": f"{reason} (at most {self.max_body_bytes} bytes within "
                                       f"{self.read_timeout_s:g} s)"}).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(payload)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
