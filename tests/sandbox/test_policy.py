"""SandboxPolicy validation and the seccomp program's shape."""

from __future__ import annotations

import struct

import pytest

from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox import seccomp
from vt_envs.sandbox.policy import UNSAFE_ISOLATION, SandboxPolicy


def test_unknown_isolation_names_the_unsafe_spelling():
    with pytest.raises(InvalidConfigError, match=UNSAFE_ISOLATION):
        SandboxPolicy(isolation="none")


@pytest.mark.parametrize("field", ["memory_mb", "cpu_s", "processes", "max_output_bytes"])
def test_limits_must_be_positive(field):
    with pytest.raises(InvalidConfigError, match=field):
        SandboxPolicy(**{field: 0})


def test_workdir_must_be_in_private_tmp():
    with pytest.raises(InvalidConfigError, match="/tmp/"):
        SandboxPolicy(workdir="/work")


def test_rlimits_in_bytes():
    limits = SandboxPolicy(memory_mb=512, file_size_mb=8).rlimits()
    assert limits["RLIMIT_AS"] == 512 << 20 and limits["RLIMIT_FSIZE"] == 8 << 20
    assert limits["RLIMIT_CORE"] == 0


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_is_well_formed(machine):
    program = seccomp.sandbox_filter(machine)
    assert len(program) % 8 == 0
    insns = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    for index, (code, jt, jf, _) in enumerate(insns):
        if code & 0x07 == 0x05:  # jumps stay inside the program
            assert index + 1 + max(jt, jf) < len(insns)
    assert insns[-1] == (0x06, 0, 0, 0x7FFF0000)  # the fall-through allows


def test_seccomp_unknown_arch():
    assert not seccomp.supported("sparc")
    with pytest.raises(ValueError, match="sparc"):
        seccomp.sandbox_filter("sparc")
