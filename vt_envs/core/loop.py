"""The library-owned event loop that drives the sync facade.

VT's envs are async at the core. Their sync methods (``reset``, ``step``,
``close``) run the coroutine on ONE long-lived event loop owned by the
library and return its result. One loop for the whole process means
sessions, subprocesses and connections opened by one sync call are still
usable by the next (``asyncio.run`` per call would close the loop and orphan
them), and a vector env's sub-envs run concurrently on it.

Who runs the loop:

- *Driven* (the fast path): a sync call made while no other thread uses the
  loop runs it on the calling thread, ``loop.run_until_complete``, and the
  loop stops again when the call returns. No thread hop: ~15 us a call
  instead of ~110 us through a loop thread. Between calls nothing runs on
  the loop (a sandbox's output waits in its pipe until the next call).
- *Threaded*: once another thread needs the loop while it is driven, or
  :func:`submit` schedules work that must run while the caller goes on, or
  the calling thread runs an event loop of its own (Jupyter's main thread),
  or work that must go on between calls is scheduled (:func:`keep_running`:
  a prestarted sandbox pool refilling), the loop runs in a daemon thread
  owned by the library for the rest of the process, and sync calls block on
  it.

A sync call is refused only on the thread that is running the loop (it would
wait on itself forever).

If the waiting thread is interrupted (``KeyboardInterrupt``, or any other
exception while it waits), the coroutine is cancelled on the library loop and
the caller waits, bounded, until it has unwound, so sessions are reset or
closed before control returns; the coroutine never keeps running unobserved.
A driving main thread takes Ctrl-C through its own SIGINT handler for the
call's duration (as :func:`asyncio.run` does), so the interrupt cancels the
coroutine instead of landing inside the loop's machinery.
"""

from __future__ import annotations

import _signal
import asyncio
import atexit
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import CancelledError, Future, wait
from typing import Any, TypeVar

from vt_envs.errors import AsyncContextError

__all__ = [
    "ensure_not_on_library_loop",
    "keep_running",
    "library_loop",
    "on_library_loop",
    "run_sync",
    "submit",
]

T = TypeVar("T")

#: How long a cancelled sync call waits for its coroutine to unwind (kill a
#: sandbox, interrupt a query) before re-raising the interruption anyway.
CANCEL_UNWIND_S = 15.0

_POLL_S = 0.2
_SIGINT = int(signal.SIGINT)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None  # runs the loop in threaded mode
_driver: threading.Thread | None = None  # runs the loop now, inside a driven sync call
_wants_thread = False  # another thread needs the loop while it is driven
# (loop, reader, writer): the socket pair a driving main thread's signals wake the loop with
_wakeup: tuple[asyncio.AbstractEventLoop, socket.socket, socket.socket] | None = None


def library_loop() -> asyncio.AbstractEventLoop:
    """Return the library's event loop (created on first use; it may not be running)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
        return _loop


def _threaded_locked() -> bool:
    return _thread is not None and _thread.is_alive()


def _start_thread_locked() -> None:
    """Make sure the loop runs in the library's thread, or will once the driver stops."""
    global _thread, _wants_thread
    if _threaded_locked():
        return
    if _driver is not None:
        _wants_thread = True  # the driver hands the loop to a thread when its call returns
        return
    assert _loop is not None
    _thread = threading.Thread(target=_loop.run_forever, name="vt-envs-loop", daemon=True)
    _thread.start()


def on_library_loop() -> bool:
    """Whether the calling thread is the one running the library loop now."""
    current = threading.current_thread()
    return current is _driver or (_thread is not None and current is _thread)


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
    """Schedule ``coro`` on the library loop; return a concurrent future.

    The loop runs in the library's thread from then on, so ``coro`` makes
    progress while the caller goes on.
    """
    loop = library_loop()
    with _lock:
        _start_thread_locked()
    return asyncio.run_coroutine_threadsafe(coro, loop)


def keep_running() -> None:
    """Background work was just scheduled on the library loop (a pool refilling) that
    must go on between sync calls: when the driven call it came from returns, the
    loop moves to the library's thread. A no-op elsewhere."""
    global _wants_thread
    with _lock:
        if _driver is not None and _loop is not None and asyncio._get_running_loop() is _loop:
            _wants_thread = True


def run_sync(coro: Coroutine[Any, Any, T], *, method: str, async_method: str) -> T:
    """Run ``coro`` on the library loop and wait for its result.

    ``method``/``async_method`` name the sync method and its coroutine twin
    for the error raised when this is called on the library loop's thread.
    On any exception while waiting (``KeyboardInterrupt`` included) the
    coroutine is cancelled and given up to :data:`CANCEL_UNWIND_S` seconds to
    unwind before the exception propagates.
    """
    global _driver
    try:
        ensure_not_on_library_loop(method, async_method)
    except AsyncContextError:
        coro.close()  # avoid "coroutine was never awaited"
        raise
    loop = library_loop()
    own_loop = asyncio._get_running_loop() is not None  # e.g. Jupyter's, on this thread
    current = threading.current_thread()
    # Ctrl-C is held back from claiming the loop to releasing it, so no interrupt can
    # leave the loop claimed by a call that is gone.
    with _sigint_cancels(loop) as interrupt:
        with _lock:
            drive = not own_loop and not _threaded_locked() and _driver is None
            if drive:
                _driver = current
            else:
                _start_thread_locked()
        if drive:
            try:
                result = _drive(loop, coro, interrupt)
            finally:
                _release()
                if interrupt.task is None:  # interrupted before its task existed
                    coro.close()
    if interrupt.count:
        if not drive:
            coro.close()
        raise KeyboardInterrupt
    return result if drive else _wait_for_thread(loop, coro)


def _release() -> None:
    """The driving call is over: free the loop, or hand it to a thread if one waits."""
    global _driver, _wants_thread
    with _lock:
        _driver = None
        if _wants_thread:
            _wants_thread = False
            _start_thread_locked()


class _Interrupt:
    """Ctrl-Cs seen during a driven call, and the task the first one cancels."""

    def __init__(self) -> None:
        self.count = 0
        self.task: asyncio.Task[Any] | None = None


def _drive(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], interrupt: _Interrupt
) -> T:
    """Run ``coro`` to completion on this thread (the caller releases the loop)."""
    task = interrupt.task = loop.create_task(coro)
    try:
        loop.run_until_complete(task)
    except BaseException:
        if not task.done():  # raised outside the task: cancel it all the same
            task.cancel()
            _unwind(loop, task)
        if interrupt.count:  # our SIGINT handler cancelled it: report the Ctrl-C
            raise KeyboardInterrupt from None
        raise
    return task.result()


def _unwind(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Run the loop until the cancelled ``task`` is done, or :data:`CANCEL_UNWIND_S`."""
    if task.done():
        return
    stop = loop.call_later(CANCEL_UNWIND_S, loop.stop)
    try:
        loop.run_until_complete(asyncio.wait({task}))
    except RuntimeError:  # stopped by the bound: the task goes on at the next call
        pass
    finally:
        stop.cancel()


@contextlib.contextmanager
def _sigint_cancels(loop: asyncio.AbstractEventLoop) -> Iterator[_Interrupt]:
    """On the main thread with Python's default SIGINT handler: the first Ctrl-C is
    recorded and cancels ``interrupt.task`` once there is one (the caller raises
    ``KeyboardInterrupt`` when the call has unwound); a second one raises at once.

    While it holds, a signal also writes to a socket the loop watches, so the
    loop's selector wakes and the handler runs at once (a simulated one,
    ``_thread.interrupt_main()``, interrupts no system call by itself).
    ``_signal``, not ``signal``: the same calls without enum conversions.
    """
    interrupt = _Interrupt()
    if (
        threading.current_thread() is not threading.main_thread()
        or _signal.getsignal(_SIGINT) is not signal.default_int_handler
    ):
        yield interrupt
        return

    def on_sigint(signum: int, frame: Any) -> None:
        interrupt.count += 1
        if interrupt.count > 1:
            raise KeyboardInterrupt
        if interrupt.task is not None and not interrupt.task.done():
            interrupt.task.cancel()

    on_sigint.vt_library_handler = True  # type: ignore[attr-defined]  (for a forked child)
    previous_fd = _signal.set_wakeup_fd(_wakeup_fd(loop), warn_on_full_buffer=False)
    _signal.signal(_SIGINT, on_sigint)
    try:
        yield interrupt
    finally:
        _signal.signal(_SIGINT, signal.default_int_handler)
        _signal.set_wakeup_fd(previous_fd)


def _wakeup_fd(loop: asyncio.AbstractEventLoop) -> int:
    """The write end of a socket pair whose read end ``loop`` drains (made once per loop)."""
    global _wakeup
    if _wakeup is None or _wakeup[0] is not loop:
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)

        def drain() -> None:
            with contextlib.suppress(OSError):
                while reader.recv(4096):
                    pass

        loop.add_reader(reader.fileno(), drain)
        _wakeup = (loop, reader, writer)
    return _wakeup[2].fileno()


def _wait_for_thread(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the loop's thread and block until it is done."""
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


def _after_fork_in_child() -> None:
    # The parent's loop (its selector, its thread) is not this process's, nor the
    # SIGINT handler and wakeup socket of a call it was driving when it forked.
    global _loop, _thread, _driver, _wants_thread, _lock, _wakeup
    if threading.current_thread() is threading.main_thread():
        if getattr(_signal.getsignal(_SIGINT), "vt_library_handler", False):
            _signal.signal(_SIGINT, signal.default_int_handler)
        if _wakeup is not None:
            previous = _signal.set_wakeup_fd(-1)
            if previous != _wakeup[2].fileno():  # not ours: put it back
                _signal.set_wakeup_fd(previous)
    _lock = threading.Lock()
    _loop, _thread, _driver, _wants_thread, _wakeup = None, None, None, False, None


def _shutdown() -> None:
    loop = _loop
    if loop is not None and not loop.is_closed() and _thread is not None and _thread.is_alive():
        loop.call_soon_threadsafe(loop.stop)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown)
