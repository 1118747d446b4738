"""File access inside an agent's working copy that no symlink, ``..`` or race can escape.

The agent controls its working copy through bash: it can replace any
directory with a symlink to ``/etc`` (or to wherever the host keeps hidden
tests) at any moment. Host-side code that reads or writes the copy (the
editor tool, the diff taken at submission) therefore never resolves a path
by name. :class:`SafeRoot` walks each path one component at a time from an
open directory descriptor with ``O_NOFOLLOW``: a symlink anywhere on the way
is refused (:class:`PathError`), and there is no window between a check and
its use for the agent to swap a component. Paths may be relative to the
root or absolute inside the name the agent sees it under
(``/tmp/repo/src/x.py``); anything else is refused.

Nothing here blocks on what the agent made: files are opened with
``O_NONBLOCK`` and the open descriptor is checked (``fstat``) before it is read,
so a FIFO swapped in for a file after any earlier check is refused at once
instead of blocking the caller's open() until a writer comes (the editor runs on
the host's event loop). A write the copy's filesystem has no room for raises
:class:`NoSpaceError` and leaves the file as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Entry", "NoSpaceError", "PathError", "SafeRoot"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# O_NONBLOCK: opening a FIFO (or a file under a lease) returns at once instead of waiting.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFDIR: "a directory",
}
#: Files the agent's tools may create get these bits (the sandbox runs as another uid).
FILE_MODE = 0o666
DIR_MODE = 0o777


class PathError(ValueError):
    """A path the agent gave cannot be used (the message is for the agent)."""


class NoSpaceError(PathError):
    """A write found no room on the copy's filesystem (its disk quota); nothing changed."""


@dataclass(frozen=True)
class Entry:
    """One directory entry: its path relative to the root, and whether it is a directory."""

    path: str
    is_dir: bool


class SafeRoot:
    """Symlink-proof access to the tree under ``root`` (a host directory).

    Args:
        root: the working copy on the host.
        shown_as: the absolute path the agent sees the root under (``/tmp/repo``);
            absolute paths must start with it.
        device: the ``st_dev`` the root must be on (a working copy's own filesystem):
            if ``root`` ever leads elsewhere, every call is refused.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        shown_as: str = "/tmp/repo",
        device: int | None = None,
    ):
        self.root = os.fspath(root)
        self.shown_as = posixpath.normpath(shown_as)
        self.device = device

    # ---------------------------------------------------------------- paths

    def relative(self, path: str) -> str:
        """``path`` (relative, or absolute under :attr:`shown_as`) as a clean relative path;
        ``""`` is the root. Raises :class:`PathError` for anything outside."""
        if not isinstance(path, str) or not path.strip() or "\x00" in path:
            raise PathError(f"path must be a non-empty string, got {path!r}")
        path = path.strip()
        if path.startswith("/"):
            clean = posixpath.normpath(path)
            if clean != self.shown_as and not clean.startswith(self.shown_as + "/"):
                raise PathError(
                    f"{path} is outside the repository; paths are relative to its root or "
                    f"absolute under {self.shown_as}"
                )
            path = clean[len(self.shown_as) :].lstrip("/")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise PathError(f"{path} leaves the repository ('..' is not allowed)")
        return "/".join(parts)

    def shown(self, rel: str) -> str:
        """How the agent sees ``rel``: absolute under :attr:`shown_as`."""
        return self.shown_as if not rel else f"{self.shown_as}/{rel}"

    # --------------------------------------------------------- descriptors

    def _open_dir(self, parts: list[str], *, create: bool = False) -> int:
        """An fd of the directory ``parts`` below the root, never through a symlink."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:  # the copy itself is gone (closed, discarded)
            reason = os.strerror(exc.errno or 0)
            raise PathError(f"the repository is unavailable: {reason}") from None
        if self.device is not None and os.fstat(fd).st_dev != self.device:
            os.close(fd)
            raise PathError("the repository is unavailable (its filesystem is gone)")
        try:
            for i, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create or len(part.encode()) > 255:
                        missing = self.shown("/".join(parts[: i + 1]))
                        raise PathError(f"{missing} does not exist") from None
                    child = self._make_dir(part, fd, "/".join(parts[: i + 1]))
                except OSError as exc:
                    raise self._refused("/".join(parts[: i + 1]), exc) from None
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _make_dir(self, name: str, fd: int, rel: str) -> int:
        try:
            os.mkdir(name, DIR_MODE, dir_fd=fd)
            os.chmod(name, DIR_MODE, dir_fd=fd)
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:  # no room for it, or swapped for a symlink meanwhile
            raise self._refused(rel, exc) from None

    def _refused(self, rel: str, exc: OSError) -> PathError:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return PathError(f"{self.shown(rel)} is a symlink or not a directory; refused")
        if exc.errno in _NO_SPACE:
            return NoSpaceError(f"{self.shown(rel)} was not written: no space left")
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return PathError(f"{self.shown(rel)} is busy (leased or locked by a process)")
        return PathError(f"{self.shown(rel)}: {os.strerror(exc.errno or 0)}")

    def _split(self, rel: str) -> tuple[list[str], str]:
        if not rel:
            raise PathError(f"{self.shown_as} is the repository itself, not a file")
        *parents, name = rel.split("/")
        return parents, name

    # ------------------------------------------------------------ queries

    def kind(self, rel: str) -> str | None:
        """``"file"``, ``"dir"``, ``"other"`` (symlinks included) or ``None`` if absent."""
        if not rel:
            return "dir"
        parents, name = self._split(rel)
        try:
            fd = self._open_dir(parents)
        except PathError:
            return None
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:  # absent, or a name too long for the filesystem
            return None
        finally:
            os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            return "dir"
        return "file" if stat.S_ISREG(info.st_mode) else "other"

    def read(self, rel: str, *, max_bytes: int = 4 << 20) -> bytes:
        """The bytes of the regular file ``rel`` (at most ``max_bytes``, else PathError)."""
        parents, name = self._split(rel)
        fd = self._open_dir(parents)
        try:
            try:
                file_fd = os.open(name, _READ_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise PathError(f"{self.shown(rel)} does not exist") from None
            except OSError as exc:
                raise self._refused(rel, exc) from None
        finally:
            os.close(fd)
        with os.fdopen(file_fd, "rb") as f:
            # What was opened, not what a name pointed to a moment before.
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
                raise PathError(f"{self.shown(rel)} is {kind}, not a regular file; refused")
            os.set_blocking(f.fileno(), True)  # a regular file: plain reads from here on
            if info.st_size > max_bytes:
                raise PathError(f"{self.shown(rel)} is {info.st_size} bytes, over {max_bytes}")
            return f.read(max_bytes + 1)[:max_bytes]

    def write(self, rel: str, data: bytes, *, create_parents: bool = False) -> None:
        """Replace (or create) the regular file ``rel`` with ``data``.

        The new content is written to a temporary file in the same directory
        and renamed over the old one, so a reader never sees half a file and
        a symlink at ``rel`` is replaced, never followed.
        """
        parents, name = self._split(rel)
        fd = self._open_dir(parents, create=create_parents)
        temp = f".vt-edit-{os.getpid()}-{name}"
        try:
            if self._stat(name, fd) == "dir":
                raise PathError(f"{self.shown(rel)} is a directory")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                file_fd = os.open(temp, flags, FILE_MODE, dir_fd=fd)
            except FileExistsError:
                os.unlink(temp, dir_fd=fd)
                file_fd = os.open(temp, flags, FILE_MODE, dir_fd=fd)
            try:
                with os.fdopen(file_fd, "wb") as f:
                    f.write(data)
                    os.fchmod(f.fileno(), FILE_MODE)
                os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:  # (no room, most likely): the old file stays, whole
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=fd)
                raise
        except OSError as exc:
            raise self._refused(rel, exc) from None
        finally:
            os.close(fd)

    def remove(self, rel: str) -> None:
        """Delete the file ``rel`` (a symlink is deleted itself, never its target)."""
        parents, name = self._split(rel)
        fd = self._open_dir(parents)
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._refused(rel, exc) from None
        finally:
            os.close(fd)

    def walk(self, rel: str = "", *, max_depth: int | None = None) -> Iterator[Entry]:
        """Entries below directory ``rel``, sorted, depth-first; symlinks are listed as
        files, never entered; ``.git`` is skipped. Iterative: no tree is too deep."""
        parts = rel.split("/") if rel else []
        stack = [(self._open_dir(parts), rel, 1, None)]
        try:
            while stack:
                fd, base, depth, names = stack[-1]
                if names is None:
                    try:
                        names = sorted(os.listdir(fd))
                    except OSError:
                        names = []
                    names.reverse()
                    stack[-1] = (fd, base, depth, names)
                if not names:
                    os.close(fd)
                    stack.pop()
                    continue
                name = names.pop()
                if name == ".git":
                    continue
                path = f"{base}/{name}" if base else name
                is_dir = self._stat(name, fd) == "dir"
                yield Entry(path, is_dir)
                if is_dir and (max_depth is None or depth < max_depth):
                    try:
                        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:  # swapped for a symlink meanwhile: not entered
                        continue
                    stack.append((child, path, depth + 1, None))
        finally:
            for fd, *_ in stack:
                os.close(fd)

    @staticmethod
    def _stat(name: str, fd: int) -> str | None:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:  # gone, or a name the filesystem refuses
            return None
        return "dir" if stat.S_ISDIR(info.st_mode) else "file"
