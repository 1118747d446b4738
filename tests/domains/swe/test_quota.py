"""VT-SWE-v0's disk quota is the kernel's, and the editor never blocks the host loop.

Each attack goes through ``gym.make("VT-SWE-v0").step`` and once got past the old quota (a
path walk polled while bash ran): a tree deeper than ``PATH_MAX``, files deleted while
still open, agent code writing at import during the hidden-test run, and the editor's own
writes. A probe thread samples the filesystem that holds each working copy made during the
test (``os.statvfs`` of the copy) and keeps the most it ever held beyond what it held when
the copy was made; it must never pass the quota.
"""

from __future__ import annotations

import json
import os
import threading

import gymnasium as gym
import pytest

import vt_envs  # noqa: F401  (registers the ids)
from vt_envs.domains.swe.workspace import Workspace

MB = 1 << 20


def _call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _bash(command):
    return _call("bash", command=command)


class _Probe:
    """Every 5 ms, the bytes and inodes in use on the filesystem of each working copy made
    while it runs, minus what was in use when the copy was made; the peaks are kept."""

    def __init__(self, monkeypatch):
        self.copies: list[tuple[Workspace, int, int, int]] = []
        self.peak_bytes = self.peak_inodes = 0
        made = Workspace.__init__

        def recording(workspace, *args, **kwargs):
            made(workspace, *args, **kwargs)
            self.copies.append((workspace, *self._used(workspace)))

        monkeypatch.setattr(Workspace, "__init__", recording)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _used(workspace):
        info = os.statvfs(workspace.path)
        used = (info.f_blocks - info.f_bfree) * info.f_frsize
        return used, info.f_files - info.f_ffree, info.f_blocks

    def _sample(self):
        while not self._stop.wait(0.005):
            for workspace, bytes0, inodes0, blocks in list(self.copies):
                try:
                    used, inodes, now = self._used(workspace)
                except OSError:  # closed meanwhile
                    continue
                if now != blocks:  # not the copy's filesystem (closing: the path is moot)
                    continue
                self.peak_bytes = max(self.peak_bytes, used - bytes0)
                self.peak_inodes = max(self.peak_inodes, inodes - inodes0)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self


def _step_all(env, actions):
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return obs, reward, terminated, truncated, info


def _ends_on_the_quota(env, action, quota_mb):
    obs, reward, terminated, truncated, info = env.step(action)
    assert (terminated, truncated, reward) == (False, True, 0.0), obs["text"][-500:]
    assert info["truncation"] == "disk_quota" and info["tool"]["error"] == "disk_quota"
    assert info["verifier_parts"]["disk_quota"] == 1.0
    assert info["tool"]["latency_s"] < 15  # stopped while running, not at its deadline
    assert info["tool"]["metrics"]["disk_bytes"] <= quota_mb * MB + 4096


# A tree 600 directories deep (6,600 characters, past PATH_MAX) with 8 MB files at its
# bottom: 320 MB against a 16 MB quota. The walk could not open its lower levels.
DEEP_FILL = (
    "for i in $(seq 600); do mkdir dddddddddd && cd dddddddddd || break; done; "
    "for i in $(seq 40); do head -c 8M /dev/zero > f$i || break; done; sleep 20"
)
# Ten 40 MB files, each deleted at once but kept open by the shell: 400 MB no walk sees.
UNLINKED_FILL = (
    "for i in $(seq 10); do exec {fd}>u$i; rm u$i; head -c 40M /dev/zero >&$fd || break; "
    "done; sleep 20"
)


@pytest.mark.parametrize("command", [DEEP_FILL, UNLINKED_FILL], ids=["deep-tree", "unlinked"])
def test_a_fill_no_path_walk_sees_is_stopped_at_the_quota(monkeypatch, command):
    probe = _Probe(monkeypatch)
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", disk_quota_mb=16)
    try:
        env.reset(seed=0)
        _ends_on_the_quota(env, _bash(command), 16)
    finally:
        env.close()
        probe.stop()
    assert 15 * MB < probe.peak_bytes <= 16 * MB + 4096, probe.peak_bytes / MB


# Appended to the package's __init__.py: at import, in the hidden-test run, 400 MB and
# 30,000 files (each write's failure ignored, so the tests still run).
IMPORT_FLOOD = """
import os as _os
for _i in range(10):
    try:
        with open("/tmp/repo/_big%d" % _i, "wb") as _f:
            _f.write(b"x" * (40 << 20))
    except OSError:
        pass
try:
    _os.makedirs("/tmp/repo/_flood", exist_ok=True)
    for _i in range(30000):
        open("/tmp/repo/_flood/%d" % _i, "w").close()
except OSError:
    pass
"""


def test_the_hidden_test_run_is_bounded_too(monkeypatch):
    probe = _Probe(monkeypatch)
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test")
    try:
        env.reset(seed=0)
        append = f"cat >> vtutils/__init__.py <<'X'\n{IMPORT_FLOOD}\nX"
        _, reward, terminated, _, info = _step_all(env, [_bash(append), "<submit>done</submit>"])
    finally:
        env.close()
        probe.stop()
    assert terminated and reward == 0.0, info.get("verifier_parts")
    assert len(probe.copies) == 2  # the agent's copy and the hidden-test run's
    # (Where the run binds its copy read-write the flood stops at the bounds; where it
    # binds it read-only the flood writes nothing there.)
    assert probe.peak_bytes <= 256 * MB + 4096, probe.peak_bytes / MB
    assert probe.peak_inodes <= 20_000 + 1, probe.peak_inodes


def test_editor_writes_count_at_once_and_are_refused_past_the_quota(monkeypatch):
    probe = _Probe(monkeypatch)
    env = gym.make(
        "VT-SWE-v0", repos=["vtutils"], split="test", disk_quota_mb=1, max_episode_tokens=1 << 24
    )
    text = ("0123456789abcdef" * 16 + "\n") * 1024  # 257 KB a file
    try:
        env.reset(seed=0)
        seen = []
        for i in range(6):
            obs, reward, terminated, truncated, info = env.step(
                _call("editor", command="create", path=f"blob{i}.txt", file_text=text)
            )
            seen.append((info["tool"]["ok"], obs["text"]))
            if terminated or truncated:
                break
    finally:
        env.close()
        probe.stop()
    refused = [text for ok, text in seen if not ok]
    assert refused and "disk quota" in refused[0], seen[-1][1][-400:]
    assert [ok for ok, _ in seen[: len(seen) - len(refused)]] == [True] * (len(seen) - len(refused))
    assert probe.peak_bytes <= 1 * MB + 4096, probe.peak_bytes / MB


def test_editor_writes_that_fill_the_copy_end_the_episode(monkeypatch):
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", max_files=100)
    try:
        env.reset(seed=0)
        for i in range(60):
            obs, reward, terminated, truncated, info = env.step(
                _call("editor", command="create", path=f"d{i}/x.py", file_text="x = 1\n")
            )
            if terminated or truncated:
                break
    finally:
        env.close()
    assert (terminated, truncated, reward) == (False, True, 0.0), obs["text"]
    assert info["truncation"] == "disk_quota" and info["tool"]["error"] == "disk_quota"
