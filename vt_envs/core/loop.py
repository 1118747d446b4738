"""The library-owned event loop that drives the sync facade.

VT's envs are async at the core. Their sync methods (``reset``, ``step``,
``close``) submit the coroutine to ONE long-lived event loop that runs in a
daemon thread owned by the library, and block on the result. One loop for
the whole process means sessions, subprocesses and connections opened by one
sync call are still usable by the next (``asyncio.run`` per call would close
the loop and orphan them), and a vector env's sub-envs run concurrently on it.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from vt_envs.errors import AsyncContextError

__all__ = ["ensure_not_in_loop", "library_loop", "run_sync", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def library_loop() -> asyncio.AbstractEventLoop:
    """Return the library's event loop, starting its thread on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="vt-envs-loop", daemon=True)
            _thread.start()
        return _loop


def ensure_not_in_loop(method: str, async_method: str) -> None:
    """Raise :class:`AsyncContextError` when called from a running event loop.

    Blocking on the library loop from inside another loop would stall that
    loop (and deadlock if it is the library loop itself).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise AsyncContextError(
        f"{method}() was called from inside a running event loop, where it would block "
        f"the loop. Use the coroutine instead: `await {async_method}(...)`."
    )


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Schedule ``coro`` on the library loop; return a concurrent future."""
    return asyncio.run_coroutine_threadsafe(coro, library_loop())


def run_sync(coro: Coroutine[Any, Any, T], *, method: str, async_method: str) -> T:
    """Run ``coro`` on the library loop and wait for its result.

    ``method``/``async_method`` name the sync method and its coroutine twin
    for the error raised when this is called inside a running loop.
    """
    try:
        ensure_not_in_loop(method, async_method)
    except AsyncContextError:
        coro.close()  # avoid "coroutine was never awaited"
        raise
    return submit(coro).result()


def _shutdown() -> None:
    loop = _loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


atexit.register(_shutdown)
