"""A filesystem of its own for one episode: a size- and inode-limited tmpfs the kernel bounds.

A :class:`Volume` is a ``tmpfs`` mounted with ``size`` and ``nr_inodes`` in a
private mount namespace held by one small process (the *holder*, a ``cat``
waiting on a pipe from the host). Every write to it — a sandboxed shell's, the
host-side editor's, a file deleted while still open, a tree deeper than
``PATH_MAX``, agent code imported by a test run — is counted by the kernel and
refused with ``ENOSPC`` once the volume is full; :meth:`Volume.usage` reads
what is in use from ``statvfs`` in microseconds, whatever the tree looks like.

Where it lives:

- the host reaches it at :attr:`Volume.path`, ``/proc/<holder>/root/<mount
  point>`` (the holder's view of the filesystem; only its uid and root may
  follow that link);
- a sandbox binds it by naming that same path as a bind source: the sandbox is
  then started inside the holder's mount namespace (``nsenter``), where the
  mount point is the volume (a bind from another mount namespace fails, so it
  cannot be bound from the host's; see
  :meth:`~vt_envs.sandbox.isolation.Isolation.command`).

Without root the holder makes its mount namespace inside a new user namespace
(``unshare --user --map-root-user``; tmpfs may be mounted there), and
sandboxes join that user namespace before bubblewrap makes its own below it:
the same bound, with no privilege. As root no user namespace is needed.

The volume ends when the holder does: at :meth:`Volume.close`, or when the
host process dies (the pipe closes, ``cat`` exits) — a crash leaves no mount
behind. Its pages are memory (tmpfs), charged to the memory cgroup of whoever
wrote them.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time

from vt_envs.errors import InvalidConfigError, SandboxUnavailableError

__all__ = [
    "PAGE_SIZE",
    "Volume",
    "VolumeFullError",
    "holder_namespace",
    "split_holder_path",
    "volume_tools",
]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Mount and say so; read one line: the seed directory to copy in ("" for none), and say
# so; then wait for the host's pipe to close (EOF: the host closed the volume, or died).
# Arguments: mount point, mount options.
_HOLDER_SCRIPT = (
    'mount -t tmpfs -o "$2" vt-volume "$1" && echo ready && IFS= read -r seed && '
    '{ [ -z "$seed" ] || cp -a --no-preserve=ownership "$seed/." "$1"; } && '
    "echo filled && exec cat >/dev/null 2>&1"
)
_FIX = (
    "the working copy's size-limited filesystem needs util-linux (`unshare`, `mount`, "
    "`nsenter`: `apt-get install -y util-linux mount`) and, without root, unprivileged user "
    "namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1)"
)


class VolumeFullError(InvalidConfigError):
    """Raised when a volume's seed does not fit its size or inode bound."""


def volume_tools() -> tuple[str, str]:
    """Paths of ``unshare`` and ``nsenter``; raises :class:`SandboxUnavailableError`."""
    found = shutil.which("unshare"), shutil.which("nsenter")
    if None in found or shutil.which("mount") is None:
        raise SandboxUnavailableError(f"no unshare/nsenter/mount on PATH: {_FIX}")
    return found  # type: ignore[return-value]


class Volume:
    """A ``size_bytes`` / ``inodes`` tmpfs in its own mount namespace (module docstring).

    Args:
        size_bytes: the most bytes of file data it holds (rounded up to pages).
        inodes: the most inodes (files, directories, links; its root is one).
        prefix: the name prefix of its private host directory (``0700``, in the
            system temp dir, which every sandbox masks).
        name: the mount point's name in that directory.
        seed: a directory whose contents the volume starts with (``cp -a``, ownership
            not kept; copied in the holder's namespace, which saves spawning a copier
            and resolving every path through ``/proc``).
        defer_fill: return once mounted; :meth:`fill` gives the seed later (a volume
            made ahead of time, off an episode's critical path).

    Attributes:
        path: where the host reaches the volume's root.
        mount_point: the volume's root as the holder's mount namespace sees it.

    Raises :class:`SandboxUnavailableError` when it cannot be made here, and
    :class:`VolumeFullError` when the seed does not fit.
    """

    def __init__(
        self,
        *,
        size_bytes: int,
        inodes: int,
        prefix: str = "vt-volume-",
        name: str = "fs",
        seed: str | os.PathLike[str] | None = None,
        defer_fill: bool = False,
        timeout_s: float = 120.0,
    ):
        for label, value in (("size_bytes", size_bytes), ("inodes", inodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"Volume {label} must be a positive int, got {value!r}")
        unshare, _ = volume_tools()
        self.size_bytes, self.inodes, self.timeout_s = size_bytes, inodes, timeout_s
        self._dir = tempfile.mkdtemp(prefix=prefix)  # 0700
        self.mount_point = os.path.join(self._dir, name)
        self._holder: subprocess.Popen[bytes] | None = None
        self._lines = b""  # what the holder said and was not read yet
        self.filled = False
        try:
            os.mkdir(self.mount_point, 0o700)
            self._holder = self._start_holder(unshare)
            if not defer_fill:  # (sent now: the holder reads it once mounted)
                self._send_seed(seed)
            self._expect(b"ready", "could not mount a private tmpfs")
            self.path = f"/proc/{self._holder.pid}/root{self.mount_point}"
            self._check_mounted()
            if not defer_fill:
                self._expect(b"filled", f"could not copy {seed!r} into the volume")
                self._fill_done()
        except BaseException:
            self.close()
            raise

    def fill(self, seed: str | os.PathLike[str] | None) -> None:
        """Copy ``seed``'s contents in (once, on a volume made with ``defer_fill``)."""
        if self.filled or self._holder is None:
            raise InvalidConfigError("Volume.fill: the volume is filled already, or closed")
        try:
            self._send_seed(seed)
            self._expect(b"filled", f"could not copy {seed!r} into the volume")
            self._fill_done()
        except BaseException:
            self.close()
            raise

    def _start_holder(self, unshare: str) -> subprocess.Popen[bytes]:
        userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        options = f"size={self.size_bytes},nr_inodes={self.inodes},mode=0700,nosuid,nodev"
        argv = [unshare, *userns, "--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
        return subprocess.Popen(
            [*argv, _HOLDER_SCRIPT, "vt-volume", self.mount_point, options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Its own session: a Ctrl-C to the host's process group does not end it early;
            # it ends when the host closes (or loses) the pipe on its stdin.
            start_new_session=True,
            cwd="/",
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )

    def _send_seed(self, seed: str | os.PathLike[str] | None) -> None:
        line = os.fspath(seed) if seed is not None else ""
        if "\n" in line or "\0" in line:
            raise InvalidConfigError(f"a volume's seed path cannot hold a newline: {line!r}")
        assert self._holder is not None and self._holder.stdin is not None
        self._holder.stdin.write(line.encode() + b"\n")
        self._holder.stdin.flush()

    def _expect(self, word: bytes, failure: str) -> None:
        """Wait (up to ``timeout_s``) for the holder's next line to be ``word``."""
        assert self._holder is not None and self._holder.stdout is not None
        fd, deadline = self._holder.stdout.fileno(), time.monotonic() + self.timeout_s
        while b"\n" not in self._lines:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 256) if ready else b""
            if not chunk:
                break
            self._lines += chunk
        line, _, self._lines = self._lines.partition(b"\n")
        if line == word:
            return
        holder = self._holder
        holder.kill()
        _, errors = holder.communicate(timeout=10)
        message = errors.decode(errors="replace")[-500:]
        if "No space left" in message:
            raise VolumeFullError(f"{failure}: it does not fit ({message.strip()})")
        raise SandboxUnavailableError(
            f"{failure} ({message!r}, exit status {holder.returncode}): {_FIX}"
        )

    def _fill_done(self) -> None:
        assert self._holder is not None and self._holder.stdout and self._holder.stderr
        self._holder.stdout.close()
        self._holder.stderr.close()
        self.filled = True

    def _check_mounted(self) -> None:
        """Fail closed unless :attr:`path` is a filesystem of its own of the asked size."""
        here, there = os.stat(self.mount_point), os.stat(self.path)
        info = os.statvfs(self.path)
        if here.st_dev == there.st_dev or info.f_blocks * info.f_frsize < self.size_bytes:
            raise SandboxUnavailableError(
                f"{self.path} is not a {self.size_bytes}-byte filesystem of its own: {_FIX}"
            )
        #: The volume's device number: what :attr:`path` must lead to (while the holder
        #: exits, the path leads to the host's mount point for a moment).
        self.device = there.st_dev
        self._blocks = info.f_blocks
        assert self._holder is not None
        _LIVE[self._holder.pid] = os.stat(f"/proc/{self._holder.pid}/ns/mnt").st_ino

    @property
    def holder_pid(self) -> int | None:
        """The holder's pid while the volume is open."""
        return self._holder.pid if self._holder is not None else None

    @property
    def closed(self) -> bool:
        return self._holder is None

    def usage(self) -> tuple[int, int]:
        """``(bytes, inodes)`` in use (its root directory included), from ``statvfs``.
        Raises ``OSError`` once the volume is closed or its holder is gone."""
        info = os.statvfs(self.path)
        if info.f_blocks != self._blocks:  # not the volume: its holder is exiting
            raise FileNotFoundError(f"the volume at {self.path} is gone")
        return (info.f_blocks - info.f_bfree) * info.f_frsize, info.f_files - info.f_ffree

    def close(self) -> None:
        """End the holder (the tmpfs goes once no sandbox is left in it) and delete the
        private host directory (idempotent)."""
        holder, self._holder = self._holder, None
        if holder is not None:
            _LIVE.pop(holder.pid, None)
            for pipe in (holder.stdin, holder.stdout, holder.stderr):
                if pipe is not None:
                    pipe.close()
            try:
                holder.send_signal(signal.SIGKILL)
            except ProcessLookupError:  # already gone
                pass
            holder.wait()  # reaped only now: until then its pid cannot be reused
        if os.path.isdir(self._dir):
            shutil.rmtree(self._dir, ignore_errors=True)  # (on the host: empty directories)

    def __repr__(self) -> str:
        where = getattr(self, "path", "?")
        return f"<Volume {self.size_bytes} bytes, {self.inodes} inodes at {where}>"


_HOLDER_PATH = re.compile(r"/proc/(\d+)/root(/.*)")
# pid -> inode of its mount namespace, for each open volume's holder in this process.
_LIVE: dict[int, int] = {}


def holder_namespace(pid: int) -> str:
    """``/proc/<pid>/ns/mnt`` of an open volume's holder; raises ``ValueError`` when
    ``pid`` is not one (never opened here, closed, or its pid now someone else's)."""
    path = f"/proc/{pid}/ns/mnt"
    try:
        same = os.stat(path).st_ino == _LIVE.get(pid)
    except OSError:
        same = False
    if not same:
        raise ValueError(f"/proc/{pid}/root is not an open volume of this process")
    return path


def split_holder_path(path: str) -> tuple[int | None, str]:
    """``(pid, path inside its mount namespace)`` for ``/proc/<pid>/root/...``, else
    ``(None, path)``."""
    match = _HOLDER_PATH.fullmatch(os.path.normpath(path))
    if match is None:
        return None, path
    return int(match.group(1)), match.group(2)
