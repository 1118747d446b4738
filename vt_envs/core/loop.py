"""The library-owned event loop that drives the sync facade.

VT's envs are async at the core. Their sync methods (``reset``, ``step``,
``close``) submit the coroutine to ONE long-lived event loop that runs in a
daemon thread owned by the library, and block on the result. One loop for
the whole process means sessions, subprocesses and connections opened by one
sync call are still usable by the next (``asyncio.run`` per call would close
the loop and orphan them), and a vector env's sub-envs run concurrently on it.

A sync call is refused only on the library loop's own thread (it would wait
on itself forever). Any other thread may block on it, including one that runs
an event loop of its own, as Jupyter's main thread does.

If the waiting thread is interrupted (``KeyboardInterrupt``, or any other
exception while it waits), the coroutine is cancelled on the library loop and
the caller waits, bounded, until it has unwound, so sessions are reset or
closed before control returns; the coroutine never keeps running unobserved.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from concurrent.futures import CancelledError, Future, wait
from typing import Any, TypeVar

from vt_envs.errors import AsyncContextError

__all__ = ["ensure_not_on_library_loop", "library_loop", "on_library_loop", "run_sync", "submit"]

T = TypeVar("T")

#: How long a cancelled sync call waits for its coroutine to unwind (kill a
#: sandbox, interrupt a query) before re-raising the interruption anyway.
CANCEL_UNWIND_S = 15.0

_POLL_S = 0.2

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


def on_library_loop() -> bool:
    """Whether the calling thread is the library loop's thread."""
    return _thread is not None and threading.current_thread() is _thread


def ensure_not_on_library_loop(method: str, async_method: str) -> None:
    """Raise :class:`AsyncContextError` when called on the library loop's thread.

    Blocking there would deadlock: the coroutine waited for needs that very
    thread to run.
    """
    if on_library_loop():
        raise AsyncContextError(
            f"{method}() was called from a coroutine running on VT's event loop, where it "
            f"would wait for itself forever. Use the coroutine instead: "
            f"`await {async_method}(...)`."
        )


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Schedule ``coro`` on the library loop; return a concurrent future."""
    return asyncio.run_coroutine_threadsafe(coro, library_loop())


def run_sync(coro: Coroutine[Any, Any, T], *, method: str, async_method: str) -> T:
    """Run ``coro`` on the library loop and wait for its result.

    ``method``/``async_method`` name the sync method and its coroutine twin
    for the error raised when this is called on the library loop's thread.
    On any exception while waiting (``KeyboardInterrupt`` included) the
    coroutine is cancelled and given up to :data:`CANCEL_UNWIND_S` seconds to
    unwind before the exception propagates.
    """
    try:
        ensure_not_on_library_loop(method, async_method)
    except AsyncContextError:
        coro.close()  # avoid "coroutine was never awaited"
        raise
    loop = library_loop()
    outcome: Future[T] = Future()
    tasks: list[asyncio.Task[T]] = []

    def start() -> None:
        outcome.set_running_or_notify_cancel()
        task = loop.create_task(coro)
        task.add_done_callback(lambda done: _settle(done, outcome))
        tasks.append(task)

    def cancel() -> None:
        for task in tasks:
            task.cancel()

    loop.call_soon_threadsafe(start)
    try:
        # Short waits rather than one long one: a signal (Ctrl-C) is acted on
        # only when the main thread runs bytecode, not while it blocks on a lock.
        while not wait([outcome], timeout=_POLL_S).done:
            pass
        return outcome.result()
    except BaseException:
        if not outcome.done():
            # Callbacks run in order, so the task exists by the time this runs.
            loop.call_soon_threadsafe(cancel)
            wait([outcome], timeout=CANCEL_UNWIND_S)
        raise


def _settle(task: asyncio.Task[T], outcome: Future[T]) -> None:
    """Copy a finished task's result (or exception, or cancellation) into ``outcome``."""
    if task.cancelled():
        outcome.set_exception(CancelledError())
    elif task.exception() is not None:
        outcome.set_exception(task.exception())
    else:
        outcome.set_result(task.result())


def _shutdown() -> None:
    loop = _loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


atexit.register(_shutdown)
