"""Peak host memory of a block of code: this process and, optionally, others.

:class:`PeakMemory` samples every ``interval_s`` (2 ms) on a thread while the
block runs and reports each watched process's largest rise of *anonymous*
resident memory (``RssAnon`` in ``/proc/PID/status``) over its level when the
block started. Anonymous memory is what a process allocates itself; pages of
a memory-mapped file (a safetensors checkpoint) are the page cache's and are
shared, so they are left out. Linux only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["PeakMemory", "anon_rss", "release_free_memory"]


def release_free_memory() -> None:
    """Hand memory the allocator holds but nothing uses back to the system (glibc's
    ``malloc_trim``), so a reading after it counts live memory only."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name:
        ctypes.CDLL(name).malloc_trim(0)


def anon_rss(pid: int | str = "self") -> int:
    """Anonymous resident bytes of process ``pid`` (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class PeakMemory:
    """``with PeakMemory(others=[pid, ...]) as peak: ...``; then ``peak.rise`` (this
    process) and ``peak.others_rise`` (the sum over ``others`` of each one's rise),
    in bytes."""

    def __init__(self, others: Sequence[int] = (), interval_s: float = 0.002):
        self.others = list(others)
        self.interval_s = interval_s
        self.rise = 0
        self.others_rise = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        self._base = anon_rss()
        self._bases = [anon_rss(pid) for pid in self.others]
        self._peaks = list(self._bases)
        self._peak = self._base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self.interval_s)

    def _read(self) -> None:
        self._peak = max(self._peak, anon_rss())
        for i, pid in enumerate(self.others):
            self._peaks[i] = max(self._peaks[i], anon_rss(pid))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
        self.rise = self._peak - self._base
        self.others_rise = sum(p - b for p, b in zip(self._peaks, self._bases))
