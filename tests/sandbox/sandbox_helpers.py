"""Assertions and constants shared by the sandbox tests."""

from __future__ import annotations

import os
import socket

import pytest

from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.sandbox.process import pids_of_uid

HOST_SECRET = "vt-host-secret-7f3a9c"

# Small limits keep resource-exhaustion cases fast on a 2-core machine.
SMALL = SandboxPolicy(
    memory_mb=512, workdir_mb=32, file_size_mb=8, processes=32, max_output_bytes=64 << 10
)


def assert_no_connection(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()


def assert_only_live_process(proc) -> None:
    """Exactly one process (the worker or the shell) runs as the sandbox uid, besides
    the pristine parent of a recycling sandbox (the worker's parent)."""
    live = pids_of_uid(proc.uid)
    expected = 2 if proc.recyclable else 1
    assert len(live) == expected, f"stray processes as uid {proc.uid}: {live}"


def assert_gone(uid: int, host_pids: set[int]) -> None:
    assert pids_of_uid(uid) == set(), f"processes left as uid {uid}"
    alive = {p for p in host_pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"}
    assert alive == set(), f"sandbox processes left: {alive}"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return "Z"
    return stat[stat.rindex(")") + 2]
