"""A small seccomp-BPF program: no sockets, no io_uring, no ptrace, no persistent IPC.

The network namespace already leaves the sandbox with only a loopback that
no host service listens on; this filter is a second, independent layer:
``socket()`` fails with ``EACCES`` for every address family — ``AF_UNIX``
included, since the read-only view of the host's file system holds the
socket files of host services (databases, desktop buses) — as does
``io_uring_setup`` (io_uring can open sockets without the ``socket`` call).
``socketpair()`` stays allowed: it connects a process to itself or its
children (``multiprocessing.Pipe``) and reaches nothing outside.
``ptrace``, ``process_vm_readv`` and ``process_vm_writev`` fail with
``EPERM``: sandboxed code cannot stop, read or rewrite another process (the
sandbox's own init among them), and so do ``shmget``, ``semget``, ``msgget``,
``mq_open``, ``add_key``, ``request_key`` and ``keyctl``: SysV IPC objects,
message queues and keyrings outlive the process that made them, and a
recycled sandbox must hand its next episode nothing. Syscalls from a foreign ABI (i386
``int 0x80``, x32) are refused outright, so ``socketcall`` cannot bypass the
checks.

The program is built here, on the host, as raw ``struct sock_filter`` bytes;
the code inside the sandbox only hands them to ``prctl(PR_SET_SECCOMP)``.
"""

from __future__ import annotations

import errno
import os
import struct

__all__ = ["sandbox_filter", "socket_filter", "supported"]

# AUDIT_ARCH_* and the syscall numbers the filter names, per machine.
_ARCH: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "io_uring_setup": 425,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "shmget": 29,
            "semget": 64,
            "msgget": 68,
            "mq_open": 240,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "io_uring_setup": 425,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "shmget": 194,
            "semget": 190,
            "msgget": 186,
            "mq_open": 180,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
        },
    ),
}
_DENIED_EACCES = ("io_uring_setup",)  # and socket(), every family
_DENIED_EPERM = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    # State that outlives a process and is shared by the sandbox's processes: SysV
    # IPC, POSIX message queues, kernel keyrings (per uid). Refused, so nothing an
    # episode leaves there can reach the next episode of a recycled sandbox.
    "shmget",
    "semget",
    "msgget",
    "mq_open",
    "add_key",
    "request_key",
    "keyctl",
)

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NEXT = "next"


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def supported(machine: str | None = None) -> bool:
    """Whether a filter can be built for this CPU architecture."""
    return (machine or os.uname().machine) in _ARCH


def _assemble(ops: list[tuple]) -> bytes:
    """Assemble ``("label", name)``, ``("ld", offset)``, ``("ret", value)`` and
    ``(jump, k, if_true, if_false)`` ops, jumps naming labels (or ``"next"``)."""
    labels: dict[str, int] = {}
    code = []
    for op in ops:
        if op[0] == "label":
            labels[op[1]] = len(code)
        else:
            code.append(op)

    def offset(here: int, target: str) -> int:
        distance = 0 if target == _NEXT else labels[target] - here - 1
        if not 0 <= distance < 256:
            raise ValueError(f"seccomp jump to {target!r} out of range")
        return distance

    out = []
    for here, op in enumerate(code):
        if op[0] == "ld":
            out.append(_insn(_LD_W_ABS, 0, 0, op[1]))
        elif op[0] == "ret":
            out.append(_insn(_RET_K, 0, 0, op[1]))
        else:
            kind, k, if_true, if_false = op
            out.append(_insn(kind, offset(here, if_true), offset(here, if_false), k))
    return b"".join(out)


def sandbox_filter(machine: str | None = None) -> bytes:
    """Return the filter program for ``machine`` (default: this one).

    Raises ``ValueError`` for an architecture without syscall numbers here.
    """
    machine = machine or os.uname().machine
    if machine not in _ARCH:
        raise ValueError(f"no seccomp syscall table for {machine!r}; known: {sorted(_ARCH)}")
    audit_arch, nr = _ARCH[machine]
    x32_bit = 0x40000000 if machine == "x86_64" else 0xFFFFFFFF
    ops: list[tuple] = [
        ("ld", 4),  # A = arch
        (_JEQ_K, audit_arch, _NEXT, "foreign"),
        ("ld", 0),  # A = syscall number
        (_JGE_K, x32_bit, "eacces", _NEXT),
        *((_JEQ_K, nr[name], "eacces", _NEXT) for name in _DENIED_EACCES),
        *((_JEQ_K, nr[name], "eperm", _NEXT) for name in _DENIED_EPERM),
        (_JEQ_K, nr["socket"], "eacces", "allow"),
        ("label", "foreign"),
        ("ret", _ERRNO | errno.ENOSYS),
        ("label", "eacces"),
        ("ret", _ERRNO | errno.EACCES),
        ("label", "eperm"),
        ("ret", _ERRNO | errno.EPERM),
        ("label", "allow"),
        ("ret", _ALLOW),
    ]
    return _assemble(ops)


socket_filter = sandbox_filter  # the name it had when it filtered sockets only
