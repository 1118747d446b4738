"""``vt-tool-server``: serve env tools over HTTP (see :mod:`vt_envs.server.app`).

    vt-tool-server --port 8100 --workers 4            # loopback, ports 8100-8103
    VT_TOOL_SERVER_TOKEN=... vt-tool-server --host 0.0.0.0 --port 8100

With ``--workers N`` this process supervises N worker processes, one per port
from ``--port`` up (each a uvicorn server of its own, so a tool that wedges a
process takes down one worker, not the service); a worker that dies is
started again (``worker_restarts_total`` in its ``/metrics``). Every worker
lists all of them at ``/v1/workers``; clients spread episodes over them and
send each session's calls to the worker that opened it (sticky routing).
The token is read from ``$VT_TOOL_SERVER_TOKEN`` (never from the command
line, where other users could read it); binding beyond loopback requires one.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import subprocess
import sys
import time

__all__ = ["main", "serve_worker"]

TOKEN_ENV = "VT_TOOL_SERVER_TOKEN"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_worker(host: str, port: int, workers: list[str], args: argparse.Namespace) -> None:
    """Run one worker in this process until it is stopped."""
    import uvicorn

    from vt_envs.server.app import ToolServer, create_app

    server = ToolServer(
        token=os.environ.get(TOKEN_ENV) or None,
        max_inflight=args.max_inflight,
        lease_s=args.lease_s,
        workers=workers,
        restarts=int(os.environ.get("VT_TOOL_SERVER_RESTARTS", "0")),
    )
    uvicorn.run(
        create_app(server), host=host, port=port, log_level=args.log_level, access_log=False,
        # Longer than clients keep idle connections (2 s), so a client never reuses one the
        # server is closing (a ReadError that a non-idempotent call could not retry).
        timeout_keep_alive=30, timeout_graceful_shutdown=5,
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vt-tool-server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8100, help="the first worker's port")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--max-inflight", type=int, default=256, help="calls at once per worker")
    parser.add_argument("--lease-s", type=float, default=300.0, help="idle session lifetime")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not _loopback(args.host) and not os.environ.get(TOKEN_ENV):
        raise SystemExit(
            f"vt-tool-server: binding {args.host} (beyond loopback) needs a token: set "
            f"{TOKEN_ENV} in the server's and the clients' environment"
        )
    if args.workers < 1:
        raise SystemExit(f"vt-tool-server: --workers must be >= 1, got {args.workers}")
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    urls = [f"http://{shown}:{args.port + i}" for i in range(args.workers)]
    if args.worker_index is not None or args.workers == 1:
        index = args.worker_index or 0
        serve_worker(args.host, args.port + index, urls, args)
        return 0
    return _supervise(args, urls)


def _supervise(args: argparse.Namespace, urls: list[str]) -> int:
    base = [sys.executable, "-m", "vt_envs.server.cli", "--host", args.host,
            "--port", str(args.port), "--workers", str(args.workers),
            "--max-inflight", str(args.max_inflight), "--lease-s", str(args.lease_s),
            "--log-level", args.log_level]  # fmt: skip
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


if __name__ == "__main__":
    raise SystemExit(main())
