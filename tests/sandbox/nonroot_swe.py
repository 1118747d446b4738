"""VT-SWE-v0 as an unprivileged user; started by test_nonroot.py (as root).

Without root the working copy's bounded filesystem lives in a holder's user and
mount namespaces and every sandbox of the episode (bash, the hidden-test run)
is started inside them. Checks, through ``env.step``: the fix scores 1.0 (the
hidden-test run reaches its copy), the sandbox sees the copy as its own
filesystem, a disk flood and a deleted-but-open fill end the episode at the
quota, an editor write past it is refused, and a FIFO is an observation. Prints
one JSON object: the checks that failed, with why.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from vt_envs.core.task import Task
from vt_envs.domains.swe.env import make_swe_env, with_layout

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef double(x):\n    return 2 * x\n"
HIDDEN = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
VISIBLE = "from calc import double\n\n\ndef test_double():\n    assert double(4) == 8\n"


def _task(root: Path) -> Task:
    pristine = root / "pristine"
    (pristine / "tests").mkdir(parents=True)
    (pristine / "calc.py").write_text(BUGGY)
    (pristine / "tests" / "test_hidden.py").write_text(HIDDEN)
    (pristine / "tests" / "test_visible.py").write_text(VISIBLE)
    repo = root / "repo"
    shutil.copytree(pristine, repo)
    (repo / "tests" / "test_hidden.py").unlink()
    assets = {
        "repo": str(repo),
        "pristine": str(pristine),
        "fail_to_pass": ["tests/test_hidden.py::test_add"],
        "pass_to_pass": ["tests/test_visible.py::test_double"],
        "test_files": ["tests/test_hidden.py", "tests/test_visible.py"],
    }
    return with_layout(Task("swe/demo/add", "Issue: add(2, 3) is -1.", None, assets=assets))


def _call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _episode(env, task, actions):
    env.reset(options={"task": task})
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((obs["text"], reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return steps


def check_fix_scores_one(env, task):
    fix = _call("editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b")
    *_, (text, reward, terminated, _, info) = _episode(env, task, [fix, "<submit>fixed</submit>"])
    assert terminated and reward == 1.0, (text[-300:], info.get("verifier_parts"))


def check_the_copy_is_a_filesystem_of_its_own(env, task):
    [(text, *_)] = _episode(env, task, [_call("bash", command="df -k /tmp/repo | tail -1; id -u")])
    fields = text.split()
    assert "vt-volume" in fields and "1000" in fields, text[-300:]


def _ends_on_quota(steps):
    text, reward, terminated, truncated, info = steps[-1]
    assert (terminated, truncated, reward) == (False, True, 0.0), text[-300:]
    assert info["truncation"] == "disk_quota", info
    assert info["tool"]["metrics"]["disk_bytes"] <= (8 << 20) + 4096, info["tool"]


def check_a_flood_ends_at_the_quota(env, task):
    flood = "for i in $(seq 10); do head -c 4M /dev/zero > f$i || break; done; sleep 20"
    _ends_on_quota(_episode(env, task, [_call("bash", command=flood)]))


def check_a_deleted_but_open_fill_ends_at_the_quota(env, task):
    fill = "for i in $(seq 5); do exec {fd}>u$i; rm u$i; head -c 4M /dev/zero >&$fd; done; sleep 20"
    _ends_on_quota(_episode(env, task, [_call("bash", command=fill)]))


def check_the_editor_is_refused_past_the_quota(env, task):
    small = make_swe_env(tasks=[task], disk_quota_mb=1, max_episode_tokens=1 << 24)
    text = ("0123456789abcdef" * 16 + "\n") * 1024  # 257 KB
    try:
        creates = [_call("editor", command="create", path=f"b{i}", file_text=text)
                   for i in range(5)]  # fmt: skip
        steps = _episode(small, task, creates)
    finally:
        small.close()
    refused = [s for s in steps if not s[4]["tool"]["ok"]]
    assert refused and "disk quota" in refused[0][0], steps[-1][0][-300:]


def check_a_fifo_is_an_observation(env, task):
    steps = _episode(
        env,
        task,
        [
            _call("bash", command="rm calc.py && mkfifo calc.py"),
            _call("editor", command="str_replace", path="calc.py", old_str="a", new_str="b"),
        ],
    )
    assert "not a regular file" in steps[-1][0], steps[-1][0][-300:]


CHECKS = [v for k, v in sorted(globals().items()) if k.startswith("check_")]


def main() -> int:
    failures = {}
    with tempfile.TemporaryDirectory(prefix="vt-nonroot-swe-") as root:
        task = _task(Path(root))
        env = make_swe_env(tasks=[task], disk_quota_mb=8, max_files=200, max_turns=6,
                           max_episode_tokens=1 << 24)  # fmt: skip
        try:
            for check in CHECKS:
                try:
                    check(env, task)
                except Exception:
                    failures[check.__name__] = traceback.format_exc()[-1500:]
        finally:
            env.close()
    ran = [c.__name__ for c in CHECKS]
    print(json.dumps({"uid": os.getuid(), "ran": ran, "failures": failures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
