"""A tiny seccomp-BPF program that denies network sockets.

The network namespace already leaves the sandbox with only a loopback that
no host service listens on; this filter is a second, independent layer: any
``socket()`` whose family is not ``AF_UNIX`` fails with ``EACCES``, as does
``io_uring_setup`` (io_uring can open sockets without the ``socket`` call).
Syscalls from a foreign ABI (i386 ``int 0x80``, x32) are refused outright, so
``socketcall`` cannot bypass the check.

The program is built here, on the host, as raw ``struct sock_filter`` bytes;
the code inside the sandbox only hands them to ``prctl(PR_SET_SECCOMP)``.
"""

from __future__ import annotations

import errno
import os
import struct

__all__ = ["socket_filter", "supported"]

# (AUDIT_ARCH_*, __NR_socket, __NR_io_uring_setup) per machine.
_ARCH = {
    "x86_64": (0xC000003E, 41, 425),
    "aarch64": (0xC00000B7, 198, 425),
}

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_AF_UNIX = 1


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def supported(machine: str | None = None) -> bool:
    """Whether a filter can be built for this CPU architecture."""
    return (machine or os.uname().machine) in _ARCH


def socket_filter(machine: str | None = None) -> bytes:
    """Return the filter program for ``machine`` (default: this one).

    Raises ``ValueError`` for an architecture without syscall numbers here.
    """
    machine = machine or os.uname().machine
    if machine not in _ARCH:
        raise ValueError(f"no seccomp syscall table for {machine!r}; known: {sorted(_ARCH)}")
    audit_arch, nr_socket, nr_io_uring = _ARCH[machine]
    deny = _ERRNO | errno.EACCES
    x32_bit = 0x40000000 if machine == "x86_64" else 0xFFFFFFFF
    program = [
        _insn(_LD_W_ABS, 0, 0, 4),  # 0: A = arch
        _insn(_JEQ_K, 1, 0, audit_arch),  # 1: native ABI -> 3
        _insn(_RET_K, 0, 0, _ERRNO | errno.ENOSYS),  # 2: foreign ABI: refuse
        _insn(_LD_W_ABS, 0, 0, 0),  # 3: A = syscall nr
        _insn(_JGE_K, 5, 0, x32_bit),  # 4: x32 ABI -> deny (9)
        _insn(_JEQ_K, 4, 0, nr_io_uring),  # 5: io_uring_setup -> deny (10)
        _insn(_JEQ_K, 0, 4, nr_socket),  # 6: socket -> 7, else allow (11)
        _insn(_LD_W_ABS, 0, 0, 16),  # 7: A = low 32 bits of args[0] (family)
        _insn(_JEQ_K, 2, 0, _AF_UNIX),  # 8: AF_UNIX -> allow (11)
        _insn(_RET_K, 0, 0, deny),  # 9
        _insn(_RET_K, 0, 0, deny),  # 10
        _insn(_RET_K, 0, 0, _ALLOW),  # 11
    ]
    return b"".join(program)
