"""``vt-tool-server``: serve an operator's env tools over HTTP (see :mod:`vt_envs.server.app`).

    export VT_TOOL_SERVER_TOKEN=$(python -c "import secrets; print(secrets.token_hex(16))")
    vt-tool-server --env VT-Math-v0 --env VT-SQL-v0 --workers 4   # loopback, ports 8100-8103
    vt-tool-server --config tools.yaml --host 0.0.0.0 --port 8100

The operator fixes what is served (``--env`` ids, or ``--config FILE``: env
ids, the keywords that configure their tools, the keywords clients may
choose, limits; :mod:`vt_envs.server.config`). Without either, every
registered env id whose tools can be remote is served with its defaults.
A token is required on every interface, loopback included: from
``$VT_TOOL_SERVER_TOKEN`` or ``--token-file`` (never the command line, where
other users could read it); ``--insecure-no-token`` serves without one, on
loopback only, with a warning.

With ``--workers N`` this process supervises N worker processes, one per port
from ``--port`` up (each a uvicorn server of its own, so a tool that wedges a
process takes down one worker, not the service); a worker that dies is
started again (``worker_restarts_total`` in its ``/metrics``). Every worker
lists all of them at ``/v1/workers``; clients spread episodes over them and
send each session's calls to the worker that opened it (sticky routing).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vt_envs.errors import InvalidConfigError, console_main

__all__ = ["bounded_protocol", "main", "serve_worker"]

TOKEN_ENV = "VT_TOOL_SERVER_TOKEN"
_KEEP_ALIVE_S = 30  # uvicorn's idle limit for a kept-alive connection (clients: 2 s)
_IDLE_S = _KEEP_ALIVE_S  # and for a new connection before its first byte
_LIMIT_FLAGS = {
    "max_inflight": int,
    "lease_s": float,
    "max_sessions": int,
    "max_sessions_per_client": int,
    "max_body_bytes": int,
    "read_timeout_s": float,
    "write_timeout_s": float,
    "max_connections": int,
    "max_env_configs": int,
    "shed_lag_s": float,
}


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        path = Path(args.token_file)
        if not path.is_file():
            raise InvalidConfigError(f"the token file {path} does not exist")
        if path.stat().st_mode & 0o077:
            raise InvalidConfigError(f"{path} is readable by other users; `chmod 600 {path}`")
        token = path.read_text().strip()
        if not token:
            raise InvalidConfigError(f"{path} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def _config(args: argparse.Namespace) -> Any:
    from vt_envs.server.config import ServerConfig

    if args.config:
        if args.env:
            raise InvalidConfigError("give --config or --env, not both")
        config = ServerConfig.load(args.config)
    else:
        config = ServerConfig.build(args.env or None, imports=args.imports)
    given = {name: getattr(args, name) for name in _LIMIT_FLAGS}
    given = {k: v for k, v in given.items() if v is not None}
    if given:  # flags override the file's limits
        config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, **given))
    return config


def serve_worker(host: str, port: int, workers: list[str], args: argparse.Namespace) -> None:
    """Run one worker in this process until it is stopped."""
    import uvicorn

    from vt_envs.server.app import ToolServer, create_app

    config = _config(args)
    server = ToolServer(
        config,
        token=_token(args),
        insecure_no_token=args.insecure_no_token,
        workers=workers,
        restarts=int(os.environ.get("VT_TOOL_SERVER_RESTARTS", "0")),
    )
    limits = config.limits
    uvicorn.run(
        create_app(server), host=host, port=port, log_level=args.log_level, access_log=False,
        http=bounded_protocol(limits.read_timeout_s, limits.write_timeout_s, server.metrics),
        limit_concurrency=limits.max_connections,
        # The peer's own address: X-Forwarded-For from a loopback client would otherwise
        # choose the address the per-client session cap counts against.
        proxy_headers=False,
        # Longer than clients keep idle connections (2 s), so a client never reuses one the
        # server is closing (a ReadError that a non-idempotent call could not retry).
        timeout_keep_alive=_KEEP_ALIVE_S, timeout_graceful_shutdown=5,
    )  # fmt: skip


def bounded_protocol(read_timeout_s: float, write_timeout_s: float, metrics: Any = None) -> type:
    """uvicorn's h11 protocol with deadlines uvicorn lacks (it only times out idle
    keep-alive connections), so no client can hold a connection forever:

    - **headers**: a new connection that sends nothing for ``_IDLE_S`` (as long as
      uvicorn keeps an idle one) is closed, and so is one whose request headers have not
      all arrived ``read_timeout_s`` after their first byte — a client that trickles
      headers (slowloris). (Timing from the first byte, not the connect: a client on a
      loaded machine may connect well before its request is written.)
    - **writes**: a connection whose writes stay blocked ``write_timeout_s`` (the client
      stopped reading, e.g. pipelining requests it never reads the answers of) is
      aborted; ``metrics.write_timeouts`` counts them.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        _header_timer: Any = None
        _write_timer: Any = None

        _reading_headers = False  # the header timer runs from a request's first byte

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._header_timer = self.loop.call_later(_IDLE_S, self._headers_late)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._cancel("_header_timer")
                self._reading_headers = False
            elif not self._reading_headers:  # the first byte of a request's headers
                self._cancel("_header_timer")
                self._reading_headers = True
                self._header_timer = self.loop.call_later(read_timeout_s, self._headers_late)

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout_s, self._writes_stuck)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel("_write_timer")

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel("_header_timer")
            self._cancel("_write_timer")
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _cancel(self, name: str) -> None:
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

        def _writes_stuck(self) -> None:
            self._write_timer = None
            if metrics is not None:
                metrics.write_timeouts += 1
            # abort, not close: close would wait to flush what the client will not read.
            # connection_lost then releases the reply that waits to drain.
            self.transport.abort()

    return BoundedH11


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vt-tool-server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8100, help="the first worker's port")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--config", help="the operator's config file (YAML or JSON)")
    parser.add_argument("--env", action="append", metavar="ID",
                        help="serve this env id with its defaults (repeatable)")  # fmt: skip
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MODULE", help="import it first (it registers ids)")  # fmt: skip
    parser.add_argument("--token-file", help=f"read the token from this file (else ${TOKEN_ENV})")
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve without a token (loopback only; any local user can call)",
    )
    for name, kind in _LIMIT_FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                            help=f"limits.{name} (see vt_envs.server.config.Limits)")  # fmt: skip
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    token = _token(args)
    if token and args.insecure_no_token:
        raise InvalidConfigError("a token is set; drop --insecure-no-token")
    if not token and not args.insecure_no_token:
        raise InvalidConfigError(
            f"a token is required (clients send it as a bearer token): set "
            f'{TOKEN_ENV}, e.g. `export {TOKEN_ENV}=$(python -c "import secrets; '
            f"print(secrets.token_hex(16))\")`, in the server's and the clients' environment, "
            "or pass --token-file; --insecure-no-token serves without one on loopback"
        )
    if args.insecure_no_token and not _loopback(args.host):
        raise InvalidConfigError(f"--insecure-no-token binds loopback only, not {args.host}")
    if args.workers < 1:
        raise InvalidConfigError(f"--workers must be >= 1, got {args.workers}")
    _config(args)  # refuse a bad config here, before any worker starts
    if args.insecure_no_token and args.worker_index is None:
        print("vt-tool-server: WARNING: serving without a token: every local user can run "
              "calls", file=sys.stderr, flush=True)  # fmt: skip
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    urls = [f"http://{shown}:{args.port + i}" for i in range(args.workers)]
    if args.worker_index is not None or args.workers == 1:
        index = args.worker_index or 0
        serve_worker(args.host, args.port + index, urls, args)
        return 0
    return _supervise(args, argv, urls)


def _supervise(args: argparse.Namespace, argv: list[str], urls: list[str]) -> int:
    base = [sys.executable, "-m", "vt_envs.server.cli", *argv]
    restarts = [0] * args.workers

    def spawn(i: int) -> subprocess.Popen:
        env = {**os.environ, "VT_TOOL_SERVER_RESTARTS": str(restarts[i])}
        return subprocess.Popen([*base, "--worker-index", str(i)], env=env)

    children = [spawn(i) for i in range(args.workers)]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"vt-tool-server: {args.workers} workers at {', '.join(urls)}", flush=True)
    try:
        while not stopping:
            for i, child in enumerate(children):
                if child.poll() is not None and not stopping:
                    restarts[i] += 1
                    print(f"vt-tool-server: worker {i} exited ({child.returncode}); "
                          f"restart {restarts[i]}", flush=True)  # fmt: skip
                    children[i] = spawn(i)
            time.sleep(0.2)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
    return 0


#: The ``vt-tool-server`` console script: user errors in one line, exit 2 (``--debug``:
#: traceback).
console = console_main("vt-tool-server", main)

if __name__ == "__main__":
    console()
