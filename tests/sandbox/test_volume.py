"""Volume: a tmpfs of its own the kernel bounds, reachable from the host, gone with its owner."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time

import pytest

from vt_envs.sandbox.isolation import holder_entry
from vt_envs.sandbox.volume import PAGE_SIZE, Volume, VolumeFullError


def test_the_kernel_bounds_bytes_and_inodes_whoever_writes():
    volume = Volume(size_bytes=1 << 20, inodes=10)
    try:
        assert os.stat(volume.path).st_dev != os.stat(volume.mount_point).st_dev
        assert os.listdir(volume.mount_point) == []  # the host's mount point stays empty
        with pytest.raises(OSError) as full, open(f"{volume.path}/big", "wb") as f:
            f.write(b"x" * (2 << 20))
        assert full.value.errno == errno.ENOSPC
        used, inodes = volume.usage()
        assert used == 1 << 20 and inodes == 2  # the root and the partly written file
        os.unlink(f"{volume.path}/big")
        made = 0
        with pytest.raises(OSError) as out_of_inodes:
            for made in range(20):
                os.mkdir(f"{volume.path}/d{made}")
        assert out_of_inodes.value.errno == errno.ENOSPC and made == 9
        assert volume.usage() == (0, 10)
    finally:
        path, pid = volume.path, volume.holder_pid
        volume.close()
        volume.close()
    assert not os.path.exists(path) and not os.path.exists(f"/proc/{pid}")
    assert not os.path.exists(volume.mount_point)
    with pytest.raises(OSError):
        volume.usage()


def test_a_seed_that_does_not_fit_is_a_typed_error(tmp_path):
    (tmp_path / "blob").write_bytes(b"x" * (3 * PAGE_SIZE))
    with pytest.raises(VolumeFullError, match="does not fit"):
        Volume(size_bytes=PAGE_SIZE, inodes=10, seed=tmp_path)
    volume = Volume(size_bytes=4 * PAGE_SIZE, inodes=10, seed=tmp_path)
    try:
        with open(f"{volume.path}/blob", "rb") as f:
            assert f.read() == b"x" * (3 * PAGE_SIZE)
    finally:
        volume.close()


def test_the_volume_ends_with_the_process_that_made_it():
    """No close(), no finalizer: the owner is SIGKILLed, and its holder and tmpfs go too."""
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import time
            from vt_envs.sandbox.volume import Volume
            v = Volume(size_bytes=1 << 20, inodes=10)
            print(v.holder_pid, flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    holder = int(owner.stdout.readline())
    assert os.path.exists(f"/proc/{holder}")
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{holder}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{holder}")  # (a child of init now: reaped there)


def test_sandboxes_enter_only_an_open_volumes_namespace():
    volume = Volume(size_bytes=1 << 20, inodes=10)
    try:
        enter, binds, rw_binds = holder_entry({}, {"/tmp/repo": volume.path})
        assert enter[1:3] == [f"--target={volume.holder_pid}", "--mount"]
        assert rw_binds == {"/tmp/repo": volume.mount_point} and binds == {}
        assert holder_entry({"/tmp/x": "/usr"}, {}) == ([], {"/tmp/x": "/usr"}, {})
        with pytest.raises(ValueError, match="not an open volume"):
            holder_entry({}, {"/tmp/repo": f"/proc/{os.getpid()}/root/tmp"})
    finally:
        volume.close()
    with pytest.raises(ValueError, match="not an open volume"):
        holder_entry({}, {"/tmp/repo": volume.path})
