"""Per-episode working copies of a repository: made in milliseconds, gone at close.

A :class:`Workspace` is a fresh copy of a cached base tree in a private
host directory (``0700``, under the system temp dir, which every sandbox
masks), bound read-write into the episode's sandbox at ``/tmp/repo``. The
copy is made with ``cp -a --reflink=auto`` (a copy-on-write clone where the
filesystem supports it, a plain copy elsewhere) — never hard links, which
would let an in-place write by the agent change the cached base. Files are
made writable for the sandbox's uid, which differs from the host's when VT
runs as root.

The base is never executed or parsed by the host with tools the agent can
steer (no host-side ``git`` on the copy: its ``.git/config`` is the
agent's to rewrite); the agent's change is read back through
:class:`~vt_envs.domains.swe.files.SafeRoot`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from vt_envs.domains.swe.files import DIR_MODE, FILE_MODE, SafeRoot
from vt_envs.errors import InvalidConfigError

__all__ = ["SHOWN_AS", "Workspace"]

#: Where the agent sees its working copy.
SHOWN_AS = "/tmp/repo"


class Workspace:
    """One episode's working copy of ``base`` (see the module docstring).

    Attributes:
        path: the copy on the host (``<private dir>/repo``).
        files: its :class:`SafeRoot` (paths as the agent writes them).
        created_s: how long making the copy took.
        spoiled: the copy passed its disk quota and was emptied (:meth:`discard`).
    """

    def __init__(self, base: str | os.PathLike[str]):
        base = Path(base)
        if not base.is_dir():
            raise InvalidConfigError(f"the repository base {str(base)!r} is not a directory")
        start = time.perf_counter()
        self._dir = tempfile.mkdtemp(prefix="vt-swe-")  # 0700: no other host user gets in
        self.path = Path(self._dir) / "repo"
        try:
            _copy_tree(base, self.path)
            _make_writable(self.path)
        except BaseException:
            _remove_tree(self._dir)
            raise
        self.created_s = time.perf_counter() - start
        self.spoiled = False
        self.files = SafeRoot(self.path, shown_as=SHOWN_AS)
        # Removed at close, and also if the env is dropped or crashes without closing.
        self._finalizer = weakref.finalize(self, _remove_tree, self._dir)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def usage(self, *, stop_at_bytes: int, stop_at_entries: int) -> tuple[int, int]:
        """``(bytes allocated, entries)`` of the copy, counting every file, directory and
        link without following links; the walk stops as soon as either passes its bound
        (so a copy flooded with files costs at most ``stop_at_entries`` lookups)."""
        used, entries, stack = 0, 0, [str(self.path)]
        while stack:
            try:
                scan = os.scandir(stack.pop())
            except OSError:  # removed under us, or made unreadable: nothing to count
                continue
            with scan:
                for entry in scan:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    entries += 1
                    used += info.st_blocks * 512  # allocated, so sparse files count as they are
                    if used > stop_at_bytes or entries > stop_at_entries:
                        return used, entries
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        return used, entries

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


def _copy_tree(base: Path, target: Path) -> None:
    cp = shutil.which("cp")
    if cp is not None:
        done = subprocess.run(
            [cp, "-a", "--reflink=auto", "--no-preserve=ownership", str(base), str(target)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0:
            return
        shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(base, target, symlinks=True)


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
    on the stack; ``shutil.rmtree`` where ``rm`` is missing)."""
    rm = shutil.which("rm")
    if rm is not None:
        subprocess.run([rm, "-rf", "--one-file-system", path], capture_output=True, check=False)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
