"""Sandbox limits and the names that select an isolation mode.

A :class:`SandboxPolicy` is plain configuration: which isolation to use and
how much of each resource a sandboxed episode gets. Validation happens here;
turning it into processes happens in :mod:`vt_envs.sandbox.isolation`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from vt_envs.errors import InvalidConfigError

__all__ = [
    "ISOLATION_MODES",
    "SYSTEM_PATHS",
    "UNSAFE_ISOLATION",
    "SandboxPolicy",
    "UnsafeSandboxWarning",
]

UNSAFE_ISOLATION = "none-i-understand-this-is-unsafe"
"""The only name that turns the sandbox off. Model code then runs as this
user, with this machine's files, network and environment."""

ISOLATION_MODES = ("auto", "bwrap", "unshare", UNSAFE_ISOLATION)

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""The host paths a shell and an interpreter need (``SandboxPolicy.host_paths``): programs,
libraries and configuration; no home, checkout, cache, ``/opt``, ``/srv`` or ``/var``."""


class UnsafeSandboxWarning(UserWarning):
    """Warned whenever model-written code is about to run without isolation."""


@dataclass(frozen=True)
class SandboxPolicy:
    """How a sandboxed episode is isolated and limited.

    Attributes:
        isolation: ``"auto"`` (bubblewrap, else raise
            :class:`~vt_envs.errors.SandboxUnavailableError`), ``"bwrap"``,
            ``"unshare"`` (root only, weaker: it must be asked for by name and
            warns), or :data:`UNSAFE_ISOLATION` (no isolation; warns).
        memory_mb: address-space rlimit of each process and, where cgroups
            work, the memory limit of the whole episode.
        cpu_s: CPU-seconds rlimit of each process (a backstop; the wall-clock
            timeout of each call is the primary limit).
        file_size_mb: largest file a process may write.
        workdir_mb: size of the private, memory-backed ``/tmp`` holding the
            work dir (disk fills stop here, not on the host disk).
        open_files: open file descriptors per process.
        processes: processes per sandbox (rlimit for the sandbox uid, and the
            cgroup ``pids.max`` where cgroups work).
        max_output_bytes: bytes of stdout and of stderr kept per call; the
            rest is read and dropped (the result says so).
        seccomp: install the filter that denies network sockets.
        cgroups: put each episode in its own memory/pids cgroup when the
            machine allows it (root with cgroup v1 or v2 delegated).
        python: interpreter for the Python worker (default: this one, so
            numpy/sympy installed here are importable inside).
        workdir: the work dir's path inside the sandbox.
        extra_env: variables set in the sandbox (the host environment is
            never passed through).
        uid_base: sandboxes run as a fresh unprivileged uid from
            ``[uid_base, uid_base + 2**20)``, unique per live sandbox in this
            process, so per-user limits never mix episodes.
        hidden_paths: host paths covered inside the sandbox (a directory by an
            empty tmpfs, a file by an empty one): what the code inside must not
            read although the host root is visible (an SWE task's reference
            sources, a benchmark's answers).
        host_paths: ``None`` (default): the whole host root is visible, read-only
            (minus ``/root``, ``/home``, ``/tmp`` and ``hidden_paths``); a tuple:
            only these host paths are (e.g. :data:`SYSTEM_PATHS`), plus the
            interpreter's own directories (its prefix and ``sys.path``), so a
            checkout, a cache or a copy of a benchmark's files anywhere else on
            the host is not there at all (bubblewrap only).
    """

    isolation: str = "auto"
    memory_mb: int = 2048
    cpu_s: int = 600
    file_size_mb: int = 64
    workdir_mb: int = 256
    open_files: int = 256
    processes: int = 64
    max_output_bytes: int = 1 << 20
    seccomp: bool = True
    cgroups: bool = True
    python: str = sys.executable
    workdir: str = "/tmp/work"
    extra_env: dict[str, str] = field(default_factory=dict)
    uid_base: int = 1_600_000
    hidden_paths: tuple[str, ...] = ()
    host_paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_MODES:
            raise InvalidConfigError(
                f"isolation must be one of {ISOLATION_MODES}, got {self.isolation!r}. "
                f"To run model code without a sandbox you must spell it out: "
                f"isolation={UNSAFE_ISOLATION!r}."
            )
        for name in (
            "memory_mb",
            "cpu_s",
            "file_size_mb",
            "workdir_mb",
            "open_files",
            "processes",
            "max_output_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidConfigError(
                    f"SandboxPolicy.{name} must be a positive int, got {value!r}"
                )
        if self.open_files < 16:
            raise InvalidConfigError(
                f"open_files must be >= 16 (Python needs a few), got {self.open_files}"
            )
        if any(not isinstance(p, str) or not os.path.isabs(p) for p in self.hidden_paths):
            raise InvalidConfigError(
                f"hidden_paths must be absolute host paths, got {self.hidden_paths!r}"
            )
        if self.host_paths is not None and (
            isinstance(self.host_paths, str)
            or any(not isinstance(p, str) or not os.path.isabs(p) for p in self.host_paths)
        ):
            raise InvalidConfigError(
                f"host_paths must be None (the whole host root) or a tuple of absolute host "
                f"paths such as SYSTEM_PATHS, got {self.host_paths!r}"
            )
        if not self.workdir.startswith("/tmp/") or ".." in self.workdir:
            raise InvalidConfigError(
                "workdir must be a path under /tmp/ (the sandbox's private tmpfs), "
                f"got {self.workdir!r}"
            )

    @property
    def unsafe(self) -> bool:
        return self.isolation == UNSAFE_ISOLATION

    def rlimits(self) -> dict[str, int]:
        """The rlimits applied inside the sandbox, by ``resource`` constant name."""
        mb = 1 << 20
        return {
            "RLIMIT_AS": self.memory_mb * mb,
            "RLIMIT_CPU": self.cpu_s,
            "RLIMIT_FSIZE": self.file_size_mb * mb,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_CORE": 0,
        }
