"""Per-episode cgroups: a memory and a process-count limit for the whole sandbox.

Rlimits bound each process; a cgroup bounds the episode as a whole (a fork
bomb of small processes, tmpfs pages, many medium allocations). Supported:
cgroup v1 (``memory`` and ``pids`` hierarchies) and cgroup v2 (unified, with
the controllers enabled for our parent group). Both need write access to
``/sys/fs/cgroup``, normally root; without it the layer is reported as
inactive and the other layers still apply.

The sandboxed launcher joins the group itself, through file descriptors the
host opened on the groups' ``cgroup.procs`` (so it joins before any model
code runs, and no host path is needed inside the sandbox).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["Cgroup", "cgroup_support"]

_ROOT = Path("/sys/fs/cgroup")
_PARENT = "vt_sandbox"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _sweep(parent: Path) -> None:
    # Groups are named "<host pid>-<uid>-<n>"; remove empty ones whose process is gone
    # (a host killed with SIGKILL cannot remove its own).
    for group in parent.glob("*-*-*"):
        owner = group.name.split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            try:
                group.rmdir()
            except OSError:
                pass


def cgroup_support() -> str | None:
    """Return ``"v1"`` or ``"v2"`` when per-episode groups can be made, else ``None``.

    Also removes empty groups left by dead host processes.
    """
    try:
        if (_ROOT / "cgroup.controllers").exists():
            parent = _ROOT / _PARENT
            parent.mkdir(exist_ok=True)
            controllers = (_ROOT / "cgroup.controllers").read_text().split()
            if not {"memory", "pids"} <= set(controllers):
                return None
            _write(_ROOT / "cgroup.subtree_control", "+memory +pids")
            _write(parent / "cgroup.subtree_control", "+memory +pids")
            _sweep(parent)
            return "v2"
        if (_ROOT / "memory").is_dir() and (_ROOT / "pids").is_dir():
            for hierarchy in ("memory", "pids"):
                (_ROOT / hierarchy / _PARENT).mkdir(exist_ok=True)
                _sweep(_ROOT / hierarchy / _PARENT)
            return "v1"
    except OSError:
        return None
    return None


class Cgroup:
    """One episode's group(s). Create with :meth:`create`; always :meth:`destroy`."""

    def __init__(self, dirs: list[Path]):
        self.dirs = dirs

    @classmethod
    def create(cls, version: str, name: str, memory_bytes: int, pids: int) -> Cgroup:
        """Make the group(s) and set limits; raises ``OSError`` if the kernel refuses."""
        if version == "v2":
            path = _ROOT / _PARENT / name
            path.mkdir()
            group = cls([path])
            _write(path / "memory.max", str(memory_bytes))
            _write(path / "memory.swap.max", "0")
            _write(path / "pids.max", str(pids))
            return group
        memory, pid_dir = _ROOT / "memory" / _PARENT / name, _ROOT / "pids" / _PARENT / name
        memory.mkdir()
        group = cls([memory])
        pid_dir.mkdir()
        group.dirs.append(pid_dir)
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        _write(pid_dir / "pids.max", str(pids))
        return group

    def open_attach_fds(self) -> list[int]:
        """Write-only fds on each ``cgroup.procs``; the launcher writes ``0`` to join."""
        return [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def destroy(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every member, then remove the group(s). Returns ``True`` when gone."""
        deadline = time.monotonic() + timeout_s
        while True:
            members = self.pids()
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not members or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        ok = True
        for d in self.dirs:
            for _ in range(200):  # rmdir fails with EBUSY until zombies are reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        ok = False
                        break
                    time.sleep(0.005)
        return ok
