"""The sandbox without root: bubblewrap's unprivileged user namespace, same hostile suite.

The test process is root here, so it runs the suite as uid 65534 (``nobody``):
in a private mount namespace it makes the interpreter's directories under
``/root`` and ``/home`` reachable (nothing else of them), then ``setpriv``
drops to that uid and runs ``nonroot_hostile.py``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vt_envs.sandbox.isolation import _MASKED_ROOTS, _needed_paths

HERE = Path(__file__).resolve().parent
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
    reason="needs root (to become another uid) and util-linux's unshare and setpriv",
)


def _hidden_paths_needed() -> list[str]:
    """Directories under /root or /home that an unprivileged run needs to see."""
    needed = set(_needed_paths(sys.executable)) | {str(HERE.parents[1])}
    return sorted(p for p in needed if any(p.startswith(r + "/") for r in ("/root", "/home")))


def _as_nobody(argv: list[str], home: Path) -> list[str]:
    """``argv`` as uid 65534, in a mount namespace where it can reach the interpreter."""
    keep = home / "keep"
    lines = ["set -e"]
    for i, path in enumerate(_hidden_paths_needed()):
        lines += [f"mkdir -p {keep}/{i}", f"mount --bind {shlex.quote(path)} {keep}/{i}"]
    for root in ("/root", "/home"):
        if os.path.isdir(root):
            lines.append(f"mount -t tmpfs -o mode=755 tmpfs {root}")
    for i, path in enumerate(_hidden_paths_needed()):
        lines += [f"mkdir -p {shlex.quote(path)}", f"mount --bind {keep}/{i} {shlex.quote(path)}"]
    env = f"HOME={home} PATH=/usr/bin:/bin VT_TEST_SECRET=vt-host-secret-7f3a9c"
    lines.append(
        f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups env -i {env} "
        + " ".join(shlex.quote(a) for a in argv)
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)]


def _report_as_nobody(script: str, tmp_path, timeout: int) -> dict:
    """Run ``script`` (beside this file) as uid 65534 with a home of its own under
    ``tmp_path``; its last stdout line, a JSON report."""
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(home, 0o777)
    done = subprocess.run(
        _as_nobody([sys.executable, str(HERE / script)], home),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_hostile_suite_holds_without_root(tmp_path):
    assert "/tmp" in _MASKED_ROOTS  # (the work dir stays private either way)
    report = _report_as_nobody("nonroot_hostile.py", tmp_path, timeout=900)
    assert report["uid"] == NOBODY
    layers = report["layers"]
    assert layers["as_root"] is False and layers["backend"] == "bwrap"
    assert "cgroup memory+pids limits" in layers["inactive"]
    assert len(report["ran"]) >= 60
    assert report["failures"] == {}


def test_swe_quotas_and_the_hidden_test_run_hold_without_root(tmp_path):
    """VT-SWE-v0's working copy without root: a bounded tmpfs in a holder's user and
    mount namespaces, which bash and the hidden-test run enter (``nonroot_swe.py``)."""
    report = _report_as_nobody("nonroot_swe.py", tmp_path, timeout=600)
    assert report["uid"] == NOBODY and len(report["ran"]) == 6
    assert report["failures"] == {}, json.dumps(report["failures"], indent=1)
