"""Remote tools: ``gym.make(id, tool_server=URL)`` runs the env's tools on a tool server.

:func:`attach_tool_server` swaps each of an env's tools for a
:class:`RemoteTool` with the same name, description, parameters and deadline;
the env, its parser, verifier and the trainer do not change. A remote session
is opened per episode and tool (keyed by a fresh episode id) on one of the
server's workers (spread by episode; its calls stay on that worker).

What the server runs is its operator's (:mod:`vt_envs.server.config`): the
client sends the env id, the keywords it was built with that choose its tasks
(all but the tokenizer, ``ToolEnv``'s episode keywords and the tools'
deadlines, which it applies per call: a client may shorten a deadline, never
extend one), the task *by id* with a digest of its prompt, and the calls'
arguments. A server that refuses that configuration (an env id, keyword,
tool or task it does not serve) makes the reset raise
:class:`~vt_envs.errors.ToolServerRefusedError` with the server's reason: it
is the developer's to fix, not the agent's.

Nothing else the service does raises into the episode or hangs it. Failures of
the service become failed calls the agent reads, with
``info["tool"]["error"]`` one of :data:`~vt_envs.tools.remote.protocol.ERROR_KINDS`:
unreachable, timeout, auth, busy, full, session lost (a restarted server),
server error. Retries happen only where repeating cannot run a call twice: opening
and closing a session (idempotent per episode and tool), a call refused as
busy (503: it did not run) or whose connection was refused (never sent), up
to the call's deadline. Every request is bounded by the call's deadline plus
the tool's grace (just inside the env's own backstop), so a server that hangs
cannot stall the step.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
import uuid
import weakref
import zlib
from collections.abc import Mapping
from typing import Any

from vt_envs.core.builder import TOOL_ENV_KWARGS
from vt_envs.core.tool import Tool, ToolResult
from vt_envs.errors import InvalidConfigError, ToolServerRefusedError
from vt_envs.tools.remote.protocol import ERROR_KINDS, decode_result, task_ref

__all__ = ["MAX_REPLY_BYTES", "RemoteTool", "ToolServerClient", "attach_tool_server"]

TOKEN_ENV = "VT_TOOL_SERVER_TOKEN"
_BACKSTOP_LEAD_S = 0.25  # a call's request gives up this long before the env's backstop
_OPEN_TIMEOUT_S = 120.0  # opening may build the env's tools on the server once
_UNREACHABLE_S = 5.0  # how long a refused connection is retried (a worker restarting)
_REFUSALS = (400, 403, 409, 413, 422)  # the request itself is wrong: repeating cannot help
#: The largest reply read from a server (images travel as base64 PNG inside it).
MAX_REPLY_BYTES = 64 << 20


class _Failure(Exception):
    """``kind``: an :data:`ERROR_KINDS` key. ``unsent``: the request surely did not run
    (refused connection, 503), so it may be repeated; ``broken``: the connection broke
    mid-request, so only an idempotent request may be repeated."""

    def __init__(
        self,
        kind: str,
        detail: str = "",
        *,
        unsent: bool = False,
        broken: bool = False,
        status: int | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(kind)
        self.kind, self.detail, self.unsent, self.broken = kind, detail, unsent, broken
        self.status, self.retry_after_s = status, retry_after_s


@functools.lru_cache(maxsize=1)
def _tls_context() -> Any:
    """One TLS context (httpx's default: certifi's CA bundle) for every client in the
    process: httpx makes one per client otherwise, about 0.85 MB and 20 ms each, which
    a thousand remote envs x 16 pools would pay a thousand-fold."""
    import httpx

    if hasattr(httpx, "create_ssl_context"):  # httpx >= 0.28
        return httpx.create_ssl_context()
    import ssl

    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class ToolServerClient:
    """Pooled HTTP clients of one tool server, per event loop.

    Requests are spread over ``shards`` ``httpx.AsyncClient`` pools of
    ``connections_per_shard`` connections each, by their URL (so a session's
    calls reuse one pool): httpcore's pool assigns requests in time quadratic in
    its size, so one pool of 512 connections would spend more time choosing a
    connection than the server spends answering.

    Args:
        url: any worker's base URL (``http://127.0.0.1:8100``).
        token: the shared secret (default ``$VT_TOOL_SERVER_TOKEN``).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        shards: int = 16,
        connections_per_shard: int = 32,
    ):
        if not url.startswith(("http://", "https://")):
            raise InvalidConfigError(f"tool_server must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.shards, self.connections_per_shard = shards, connections_per_shard
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._workers: list[str] | None = None
        # One /v1/workers request per loop, however many episodes open at once (500
        # concurrent asks under load each waited past their own deadline).
        self._asking: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _http(self, url: str) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        pools = self._clients.get(loop)
        if pools is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            limits = httpx.Limits(
                max_connections=self.connections_per_shard,
                max_keepalive_connections=self.connections_per_shard,
                keepalive_expiry=2.0,  # well under the server's 30 s: no stale reuse
            )
            verify = _tls_context()
            pools = [
                httpx.AsyncClient(headers=headers, limits=limits, verify=verify)
                for _ in range(self.shards)
            ]
            self._clients[loop] = pools
        return pools[zlib.crc32(url.encode()) % len(pools)]

    async def request(
        self, method: str, url: str, body: Mapping[str, Any] | None, timeout_s: float
    ) -> dict[str, Any]:
        """One request; raises :class:`_Failure` with an :data:`ERROR_KINDS` kind."""
        import httpx

        try:
            # asyncio's timeout bounds the whole request; httpx's applies per phase.
            reply = await asyncio.wait_for(self._send(method, url, body, timeout_s), timeout_s)
        except asyncio.TimeoutError as exc:
            raise _Failure("tool_server_timeout", "no answer in time") from exc
        except httpx.ConnectError as exc:
            raise _Failure("tool_server_unreachable", str(exc), unsent=True) from exc
        except httpx.TimeoutException as exc:
            raise _Failure("tool_server_timeout", type(exc).__name__) from exc
        except httpx.HTTPError as exc:  # the connection broke mid-request (a worker died)
            detail = f"{type(exc).__name__}: {exc}"
            raise _Failure("tool_server_error", detail, broken=True) from exc
        if reply.status_code == 401:
            raise _Failure("tool_server_auth")
        if reply.status_code == 404:
            raise _Failure("session_lost")
        if reply.status_code in (429, 503):
            kind = "tool_server_busy" if reply.status_code == 503 else "tool_server_full"
            raise _Failure(kind, _reason(reply), unsent=True, status=reply.status_code,
                           retry_after_s=_retry_after(reply))  # fmt: skip
        if reply.status_code >= 400:
            detail = f"HTTP {reply.status_code}: {_reason(reply)}"
            raise _Failure("tool_server_error", detail, status=reply.status_code)
        try:
            answer = reply.json()
        except ValueError as exc:
            raise _Failure("tool_server_error", "the reply was not JSON") from exc
        if not isinstance(answer, dict):
            raise _Failure("tool_server_error", "the reply was not a JSON object")
        return answer

    async def _send(
        self, method: str, url: str, body: Mapping[str, Any] | None, timeout_s: float
    ) -> Any:
        """The reply, read whole but never past :data:`MAX_REPLY_BYTES` (a server, or
        whatever sits on the wire, cannot make this process hold more)."""
        import httpx

        payload = None if body is None else dict(body)
        async with self._http(url).stream(method, url, json=payload, timeout=timeout_s) as reply:
            declared = reply.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_REPLY_BYTES:
                raise _Failure("tool_server_error", f"a reply of {declared} bytes")
            chunks, size = [], 0
            async for chunk in reply.aiter_bytes():  # decoded: a compressed bomb counts too
                size += len(chunk)
                if size > MAX_REPLY_BYTES:
                    raise _Failure("tool_server_error", f"a reply over {MAX_REPLY_BYTES} bytes")
                chunks.append(chunk)
        headers = [(k, v) for k, v in reply.headers.items()
                   if k.lower() not in ("content-encoding", "content-length")]  # fmt: skip
        return httpx.Response(reply.status_code, headers=headers, content=b"".join(chunks))

    async def workers(self, timeout_s: float = 10.0) -> list[str]:
        """The server's workers, at the host this client was given (a server bound to
        ``0.0.0.0`` can only name its ports; the host it is reached at is the caller's).
        Asked once: concurrent callers share the one request."""
        if self._workers is not None:
            return self._workers
        loop = asyncio.get_running_loop()
        asking = self._asking.get(loop)
        if asking is None or (asking.done() and asking.exception() is not None):
            asking = self._asking[loop] = asyncio.ensure_future(self._ask_workers(timeout_s))
        return await asyncio.shield(asking)

    async def _ask_workers(self, timeout_s: float) -> list[str]:
        from urllib.parse import urlsplit

        answer = await self.request("GET", f"{self.url}/v1/workers", None, timeout_s)
        given = urlsplit(self.url)
        ports = [urlsplit(str(w)).port for w in answer.get("workers") or ()]
        self._workers = [f"{given.scheme}://{given.hostname}:{port}" for port in ports if port] or [
            self.url
        ]
        return self._workers

    async def aclose(self) -> None:
        for client in self._clients.pop(asyncio.get_running_loop(), None) or ():
            await client.aclose()


class _RemoteSession:
    def __init__(self, worker: str, sid: str | None, failure: _Failure | None = None):
        self.worker, self.id, self.failure = worker, sid, failure


class RemoteTool(Tool):
    """``local``'s stand-in whose sessions and calls run on a tool server."""

    def __init__(
        self, client: ToolServerClient, env_id: str, env_kwargs: Mapping[str, Any], local: Tool
    ):
        super().__init__(timeout_s=local.timeout_s)
        self.client, self.env_id, self.env_kwargs = client, env_id, dict(env_kwargs)
        self.local = local
        self.name = local.name
        self.description = local.description
        self.parameters = local.parameters
        self.tag_argument = local.tag_argument
        self.concurrent_calls = local.concurrent_calls
        self.grace_s = local.grace_s

    async def open_session(self, task: Any, *, seed: int = 0) -> _RemoteSession:
        """Open the episode's session on a worker.

        Raises:
            ToolServerRefusedError: the server does not serve this env id, keyword, tool
                or task (its reason is the message).
        """
        episode = uuid.uuid4().hex
        body = {"episode": episode, "env_id": self.env_id, "env_kwargs": self.env_kwargs,
                "tool": self.name, "task": task_ref(task), "seed": int(seed)}  # fmt: skip
        deadline = time.monotonic() + _OPEN_TIMEOUT_S
        try:
            workers = await self.client.workers(_OPEN_TIMEOUT_S)
            worker = workers[int(episode, 16) % len(workers)]
            answer = await self._retrying(
                "POST", f"{worker}/v1/sessions", body, deadline, retry_full=False
            )
            sid = str(answer["session"])
        except _Failure as failure:
            if failure.status in _REFUSALS:
                raise ToolServerRefusedError(
                    f"the tool server at {self.client.url} refused {self.env_id}'s "
                    f"{self.name} session: {failure.detail}"
                ) from None
            # The episode goes on: every call on this session reports why it cannot run.
            return _RemoteSession(self.client.url, None, failure)
        except (KeyError, TypeError, ValueError) as exc:  # a reply that is not the protocol's
            failure = _Failure("tool_server_error", f"bad reply to open: {exc!r}")
            return _RemoteSession(self.client.url, None, failure)
        return _RemoteSession(worker, sid)

    async def call(
        self, session: _RemoteSession, arguments: Mapping[str, Any], *, timeout_s: float
    ) -> ToolResult:
        if session.failure is not None:
            return _failed(self.name, session.failure)
        url = f"{session.worker}/v1/sessions/{session.id}/call"
        body = {"arguments": dict(arguments), "timeout_s": timeout_s}
        # Just inside the env's backstop (deadline + grace), so the agent reads what happened
        # here (tool_server_timeout) rather than the backstop's generic timeout.
        deadline = time.monotonic() + timeout_s + max(self.grace_s - _BACKSTOP_LEAD_S, 0.0)
        try:
            answer = await self._retrying("POST", url, body, deadline, idempotent=False)
        except _Failure as failure:
            if failure.kind == "session_lost":
                session.failure = failure  # its state is gone for good
            return _failed(self.name, failure)
        try:
            return decode_result(answer)
        except (KeyError, TypeError, ValueError) as exc:  # not the protocol's, or over a cap
            return _failed(self.name, _Failure("tool_server_error", f"a bad reply: {exc}"))

    async def close_session(self, session: _RemoteSession | None) -> None:
        if session is None or session.id is None:
            return
        url = f"{session.worker}/v1/sessions/{session.id}"
        session.failure = session.failure or _Failure("session_lost", "closed")
        try:
            await self._retrying("DELETE", url, None, time.monotonic() + 10.0)
        except _Failure:
            pass  # unreachable or already gone: its lease reaps it on the server

    async def _retrying(
        self,
        method: str,
        url: str,
        body: Mapping[str, Any] | None,
        deadline: float,
        *,
        idempotent: bool = True,
        retry_full: bool = True,
    ) -> dict[str, Any]:
        """Send, repeating what cannot run twice (see the module docstring) until
        ``deadline``; ``retry_full``: also repeat a 429 (no room for a session)."""
        delay, refused_since = 0.05, None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Failure("tool_server_timeout")
            try:
                return await self.client.request(method, url, body, left)
            except _Failure as failure:
                if not (failure.unsent or (failure.broken and idempotent)):
                    raise
                if failure.kind == "tool_server_full" and not retry_full:
                    raise
                if failure.kind == "tool_server_unreachable":
                    refused_since = refused_since or time.monotonic()
                    if time.monotonic() - refused_since > _UNREACHABLE_S:
                        raise
                # Jittered, so clients shed together do not come back together; no sooner
                # than the server's Retry-After when that still fits the deadline.
                wait = delay * random.uniform(0.5, 1.5)
                if failure.retry_after_s and time.monotonic() + failure.retry_after_s < deadline:
                    wait = max(wait, failure.retry_after_s * random.uniform(0.5, 1.0))
                if time.monotonic() + wait >= deadline:
                    raise
                await asyncio.sleep(wait)
                delay = min(delay * 2, 1.0)

    async def aclose(self) -> None:
        await self.local.aclose()
        await self.client.aclose()


def _reason(reply: Any) -> str:
    """The server's ``{"error": reason}``, or the start of the body."""
    try:
        answer = reply.json()
    except ValueError:
        return reply.text[:300]
    error = answer.get("error") if isinstance(answer, dict) else None
    return str(error)[:1000] if error is not None else reply.text[:300]


def _retry_after(reply: Any) -> float | None:
    try:
        return min(max(float(reply.headers.get("retry-after", "")), 0.0), 30.0)
    except ValueError:
        return None


def _failed(name: str, failure: _Failure) -> ToolResult:
    detail = f" ({failure.detail})" if failure.detail else ""
    return ToolResult.failure(
        f"The {name} tool is unavailable: {ERROR_KINDS[failure.kind]}{detail}.", failure.kind
    )


def attach_tool_server(
    env: Any, url: str, *, env_id: str, env_kwargs: Mapping[str, Any], token: str | None = None
) -> Any:
    """Make ``env``'s tools :class:`RemoteTool` s of the server at ``url``; returns ``env``.

    ``env_kwargs``: what the env was built with. What is sent of it (see the module
    docstring): every keyword but the tokenizer and processor, ``ToolEnv``'s own
    episode keywords and the tools' deadlines (``*_timeout_s``); the server accepts
    those its operator lets clients set.

    Raises:
        InvalidConfigError: the env's verifier reads its tools' state (it declares
            ``reads_tools``: VT-SWE-v0 grades the working copy its bash and editor
            changed), which a remote tool keeps on the server.
    """
    if getattr(env, "verifier", None) is not None and env.verifier.reads_tools:
        raise InvalidConfigError(
            f"{env_id} cannot use tool_server=: its verifier reads the state its tools "
            "changed (the working copy), which would live on the server; run it locally"
        )
    if getattr(env, "extra_tool_names", ()):
        raise InvalidConfigError(
            f"{env_id}: extra_tools={list(env.extra_tool_names)} cannot go with tool_server=: "
            f"the server serves {env_id}'s own tools only; drop one of the two"
        )
    import json

    # The server needs what chooses the tasks; the tokenizer and the episode keywords
    # shape only this side, and deadlines travel with each call (capped by the server's).
    wanted = {
        k: v
        for k, v in env_kwargs.items()
        if k not in TOOL_ENV_KWARGS and not k.endswith("timeout_s")
    }
    for key, value in wanted.items():
        try:
            json.dumps(value)
        except TypeError as exc:
            raise InvalidConfigError(
                f"tool_server=: the server rebuilds {env_id}'s tools from its keywords, so they "
                f"must be JSON; {key}={value!r} is not ({exc}). Pass paths or plain values"
            ) from exc
    client = ToolServerClient(url, token=token)
    for name, tool in list(env.tools.items()):  # in place: the env's session keeper holds it
        env.tools[name] = RemoteTool(client, env_id, wanted, tool)
    return env
