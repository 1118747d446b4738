"""Per-episode working copies of a repository: made in milliseconds, bounded by the kernel,
gone at close.

A :class:`Workspace` is a fresh copy of a cached base tree on a filesystem of
its own: a :class:`~vt_envs.sandbox.volume.Volume` (a tmpfs of at most
``disk_quota_mb`` of data and ``max_files`` entries, in a private mount
namespace; without root, in a user namespace too), bound read-write into the
episode's sandbox at ``/tmp/repo``. The copy is made with ``cp -a`` (never hard
links, which would let an in-place write change the cached base); files are
made writable for the sandbox's uid, which differs from the host's when VT
runs as root.

The quota is the filesystem's size, so the kernel counts everything and
refuses what does not fit (``ENOSPC``): files at any depth (a tree deeper than
``PATH_MAX`` too), files deleted while still open, the host-side editor's
writes the moment they happen, and whatever runs in any sandbox the copy is
bound into — the hidden-test run's fresh copy of the pristine tree is a
Workspace as well, with the same kind of bound. :meth:`Workspace.usage` reads
the filesystem's counters (``statvfs``); the volume holds one page and one
entry more than the quota, so "past the quota" is the filesystem being full.
The copy lives in memory (tmpfs pages, charged to the memory cgroup of the
process that wrote them): a repository of N MB costs N MB of RAM per open
episode.

The base is never executed or parsed by the host with tools the agent can
steer (no host-side ``git`` on the copy: its ``.git/config`` is the
agent's to rewrite); the agent's change is read back through
:class:`~vt_envs.domains.swe.files.SafeRoot`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import weakref
from pathlib import Path

from vt_envs.core.task import Task
from vt_envs.domains.swe.files import DIR_MODE, FILE_MODE, SafeRoot
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.volume import PAGE_SIZE, Volume, VolumeFullError

__all__ = ["DISK_QUOTA_MB", "MAX_FILES", "SHOWN_AS", "Workspace", "empty_volume", "with_layout"]

#: Where the agent sees its working copy.
SHOWN_AS = "/tmp/repo"
#: A working copy's default bounds: data, and entries (files, directories, links).
DISK_QUOTA_MB = 256
MAX_FILES = 20_000


class Workspace:
    """One episode's working copy of ``base`` (see the module docstring).

    Args:
        base: the directory copied.
        disk_quota_mb: the most file data the copy may hold (the base's included).
        max_files: the most entries it may hold (the base's included).
        volume: an empty volume made ahead of time with these bounds
            (:func:`empty_volume`), filled here instead of making one.

    Attributes:
        path: the copy's root as the host reaches it (``/proc/<holder>/root/...``;
            bind it into a sandbox by this path, see :class:`~vt_envs.sandbox.volume.Volume`).
        files: its :class:`SafeRoot` (paths as the agent writes them).
        created_s: how long making the copy took.
        spoiled: the copy passed its disk quota and was emptied (:meth:`discard`).

    Raises :class:`~vt_envs.errors.InvalidConfigError` when ``base`` is not a directory
    or does not fit the bounds, and :class:`~vt_envs.errors.SandboxUnavailableError`
    when the bounded filesystem cannot be made here.
    """

    def __init__(
        self,
        base: str | os.PathLike[str],
        *,
        disk_quota_mb: int = DISK_QUOTA_MB,
        max_files: int = MAX_FILES,
        volume: Volume | None = None,
    ):
        base = Path(base)
        if not base.is_dir():
            raise InvalidConfigError(f"the repository base {str(base)!r} is not a directory")
        for name, value in (("disk_quota_mb", disk_quota_mb), ("max_files", max_files)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be a positive int, got {value!r}")
        start = time.perf_counter()
        self.quota_bytes, self.max_files = disk_quota_mb << 20, max_files
        try:
            if volume is None:
                volume = empty_volume(disk_quota_mb, max_files, defer_fill=False, seed=base)
            elif (volume.size_bytes, volume.inodes) != _bounds(disk_quota_mb, max_files):
                volume.close()
                raise InvalidConfigError("Workspace: the volume given has other bounds")
            else:
                volume.fill(base)
        except VolumeFullError:
            raise InvalidConfigError(
                f"the repository {str(base)!r} does not fit a working copy of "
                f"disk_quota_mb={disk_quota_mb}, max_files={max_files}; raise them"
            ) from None
        self._volume = volume
        self.path = Path(self._volume.path)
        try:
            _make_writable(self.path)
        except BaseException:
            self._volume.close()
            raise
        self.created_s = time.perf_counter() - start
        self.spoiled = False
        self.files = SafeRoot(self.path, shown_as=SHOWN_AS, device=self._volume.device)
        # Removed at close, and also if the env is dropped without closing (and, whatever
        # happens to this process, when it ends: the holder exits with it).
        self._finalizer = weakref.finalize(self, self._volume.close)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def usage(self) -> tuple[int, int]:
        """``(bytes allocated, entries)`` of the copy, read from its filesystem (the root
        directory is not an entry): every file at any depth, deleted-but-open files and
        the editor's writes as they happen. A closed or lost copy reads as over quota."""
        try:
            used, inodes = self._volume.usage()
        except OSError:
            return self.quota_bytes + PAGE_SIZE, self.max_files + 1
        return used, inodes - 1

    def over_quota(self) -> tuple[int, int] | None:
        """``(bytes, entries)`` if the copy is past either bound, else ``None``."""
        used, entries = self.usage()
        if used > self.quota_bytes or entries > self.max_files:
            return used, entries
        return None

    def discard(self) -> None:
        """Empty the copy now and mark it spoiled (it passed its disk quota): what the agent
        wrote is gone, and the episode's grade is 0."""
        self.spoiled = True
        _remove_tree(str(self.path))

    def close(self) -> None:
        """Delete the copy (idempotent)."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"<Workspace {self.path} closed={self.closed}>"


def _bounds(disk_quota_mb: int, max_files: int) -> tuple[int, int]:
    """The volume's size and inodes for these bounds: one page and one entry beyond them
    (and an inode for the root), so the filesystem is full exactly when the copy is past
    its quota."""
    return (disk_quota_mb << 20) + PAGE_SIZE, max_files + 2


def empty_volume(
    disk_quota_mb: int = DISK_QUOTA_MB,
    max_files: int = MAX_FILES,
    *,
    defer_fill: bool = True,
    seed: Path | None = None,
) -> Volume:
    """A volume for a working copy with these bounds (by default mounted and waiting for
    its :meth:`~vt_envs.sandbox.volume.Volume.fill`)."""
    size_bytes, inodes = _bounds(disk_quota_mb, max_files)
    return Volume(
        size_bytes=size_bytes,
        inodes=inodes,
        prefix="vt-swe-",
        name="repo",
        seed=seed,
        defer_fill=defer_fill,
    )


def _make_writable(root: Path) -> None:
    """Directories ``0777`` and regular files ``0666`` (executables ``0777``): the sandbox's
    uid must write them; no other host user can reach them through the private parent.
    (Only ever run on trusted trees: the task's repository.)"""
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        os.chmod(directory, DIR_MODE)
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_symlink():
                    continue
                if entry.is_dir():
                    stack.append(entry.path)
                else:
                    executable = entry.stat().st_mode & 0o111
                    os.chmod(entry.path, DIR_MODE if executable else FILE_MODE)


def _remove_tree(path: str) -> None:
    """Delete ``path`` however deep the agent made it (``rm -rf``, which does not recurse
    on the stack; ``shutil.rmtree`` where ``rm`` is missing). A copy's root is a mount
    point: it stays, emptied."""
    rm = shutil.which("rm")
    if rm is not None:
        subprocess.run([rm, "-rf", "--one-file-system", path], capture_output=True, check=False)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


def with_layout(task: Task, *, max_entries: int = 200) -> Task:
    """``task`` with the repository's layout (two levels deep) appended to its prompt."""
    files = SafeRoot(task.assets["repo"], shown_as=SHOWN_AS)
    entries = [e for e in files.walk(max_depth=2) if not e.path.split("/")[-1].startswith(".")]
    lines = [files.shown(e.path) + ("/" if e.is_dir else "") for e in entries[:max_entries]]
    if len(entries) > max_entries:
        lines.append(f"... ({len(entries) - max_entries} more)")
    layout = "\n".join(lines)
    return Task(
        task.id,
        f"{task.prompt}\n\nRepository layout ({SHOWN_AS}):\n{layout}",
        task.gold,
        task.metadata,
        task.assets,
    )
