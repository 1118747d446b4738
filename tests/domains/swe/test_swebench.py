"""SWE-bench-format instances on a local checkout: the test patch is applied only for the
evaluation, the gold patch is what the oracle reaches (1.0), doing nothing scores 0."""

from __future__ import annotations

import json
import subprocess

import pytest

import vt_envs
from vt_envs.domains.swe.env import make_swe_env
from vt_envs.domains.swe.oracle import DoNothingPolicy, SWEOracle
from vt_envs.domains.swe.swebench import load_swebench
from vt_envs.errors import DatasetFormatError, InvalidConfigError

# Unified diffs; a blank context line is a single space, so the lines are joined explicitly.
PATCH = "\n".join(
    [
        "diff --git a/shop/cart.py b/shop/cart.py",
        "--- a/shop/cart.py",
        "+++ b/shop/cart.py",
        "@@ -1,5 +1,5 @@",
        " def total(prices, discount=0):",
        "-    return sum(prices) - discount * len(prices)",
        "+    return sum(prices) - discount",
        " ",
        " ",
        " def count(prices):",
        "",
    ]
)
TEST_PATCH = "\n".join(
    [
        "diff --git a/tests/test_cart.py b/tests/test_cart.py",
        "--- a/tests/test_cart.py",
        "+++ b/tests/test_cart.py",
        "@@ -4,3 +4,7 @@ from shop.cart import count, total",
        " ",
        " def test_count():",
        "     assert count([1, 2]) == 2",
        "+",
        "+",
        "+def test_discount_applies_once():",
        "+    assert total([10, 20, 30], discount=5) == 55",
        "",
    ]
)
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}  # fmt: skip


def _git(cwd, *args):
    env = {**GIT_ENV, "HOME": str(cwd)}
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env)


@pytest.fixture
def instance_file(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "shop").mkdir(parents=True)
    (checkout / "tests").mkdir()
    (checkout / "shop" / "__init__.py").write_text("")
    (checkout / "shop" / "cart.py").write_text(
        "def total(prices, discount=0):\n    return sum(prices) - discount * len(prices)\n\n\n"
        "def count(prices):\n    return len(prices)\n"
    )
    (checkout / "tests" / "test_cart.py").write_text(
        "from shop.cart import count, total\n\n\ndef test_count():\n    assert count([1, 2]) == 2\n"
    )
    _git(checkout, "init", "-q")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "base")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    (checkout / "later.txt").write_text("a later commit the task must not see\n")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "later")
    instance = {
        "instance_id": "acme__shop-42",
        "repo": "acme/shop",
        "problem_statement": "total() subtracts the discount once per item; it should once.",
        "base_commit": commit,
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(["tests/test_cart.py::test_discount_applies_once"]),
        "PASS_TO_PASS": json.dumps(["tests/test_cart.py::test_count"]),
    }
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance) + "\n")
    return path, checkout


def test_instances_load_and_the_gold_patch_scores_one(instance_file, tmp_path):
    path, checkout = instance_file
    tasks = load_swebench(path, checkouts={"acme/shop": checkout}, cache=tmp_path / "cache")
    (task,) = list(tasks)
    assert task.prompt.startswith("total() subtracts") and "/tmp/repo/shop/cart.py" in task.prompt
    assert "later.txt" not in task.prompt  # the tree is base_commit's
    env = make_swe_env(tasks=tasks, max_turns=6)
    solved = vt_envs.run_episode(env, SWEOracle(), options={"task_id": task.id})
    assert solved.reward == 1.0, solved.observations[-2:]
    idle = vt_envs.run_episode(env, DoNothingPolicy(), options={"task_id": task.id})
    assert idle.reward == 0.0 and idle.infos[-1]["verifier_parts"]["pass_to_pass_broken"] == 0.0
    # The agent's copy has the old test file: the hidden test arrives only for the evaluation.
    env.reset(options={"task_id": task.id})
    command = "grep -c test_discount tests/test_cart.py"
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    obs, *_ = env.step(f"<tool_call>{call}</tool_call>")
    assert "\n0\n" in obs["text"]
    env.close()


def test_bad_instances_are_typed_errors(instance_file, tmp_path):
    path, checkout = instance_file
    with pytest.raises(InvalidConfigError, match="no local checkout"):
        load_swebench(path, checkouts={}, cache=tmp_path / "c1")
    broken = json.loads(path.read_text())
    del broken["test_patch"]
    (tmp_path / "bad.json").write_text(json.dumps([broken]))
    with pytest.raises(DatasetFormatError, match="missing"):
        load_swebench(tmp_path / "bad.json", checkouts={"acme/shop": checkout}, cache=tmp_path)
    wrong = json.loads(path.read_text())
    wrong["patch"] = PATCH.replace("discount * len(prices)", "nothing like this")
    wrong["instance_id"] = "acme__shop-43"
    (tmp_path / "wrong.json").write_text(json.dumps([wrong]))
    with pytest.raises(DatasetFormatError, match="does not apply"):
        load_swebench(tmp_path / "wrong.json", checkouts={"acme/shop": checkout}, cache=tmp_path)


@pytest.mark.parametrize(
    "field, test_id, style",
    [
        ("FAIL_TO_PASS", "test_discount_applies_once (tests.test_cart.CartTests)", "Django"),
        ("PASS_TO_PASS", "test_count", "bare test name"),
        ("FAIL_TO_PASS", "tests/test_cart.py", "not a pytest node id"),
    ],
)
def test_test_ids_pytest_cannot_run_by_name_are_refused_at_load(
    instance_file, tmp_path, field, test_id, style
):
    """Django (unittest) and SymPy (bare name) ids would load and then score 0 as
    "tampered": they are refused, with the format expected, the one given and the fix,
    before anything is written to the cache."""
    from vt_envs.domains.swe import UnsupportedTestIdError

    path, checkout = instance_file
    instance = json.loads(path.read_text())
    instance[field] = json.dumps([test_id])
    (tmp_path / "other.json").write_text(json.dumps([instance]))
    cache = tmp_path / "cache"
    with pytest.raises(UnsupportedTestIdError) as caught:
        load_swebench(tmp_path / "other.json", checkouts={"acme/shop": checkout}, cache=cache)
    message = str(caught.value)
    assert f"{field} holds {test_id!r}" in message and style in message
    assert "'path/to/test_file.py::test_name'" in message and "Fix:" in message
    assert isinstance(caught.value, DatasetFormatError)
    assert not cache.exists()
    # The pytest form of the same test loads (a parametrized id too).
    instance[field] = json.dumps(["tests/test_cart.py::test_count[a b-1]"])
    (tmp_path / "fixed.json").write_text(json.dumps([instance]))
    assert len(load_swebench(tmp_path / "fixed.json", checkouts={"acme/shop": checkout},
                             cache=cache)) == 1  # fmt: skip


def test_load_swebench_imports_from_the_swe_package_as_the_docs_show():
    """docs/envs/swe.md: `from vt_envs.domains.swe import load_swebench, make_swe_env`."""
    import vt_envs.domains.swe as swe
    from vt_envs.domains.swe import load_swebench as exported
    from vt_envs.domains.swe import make_swe_env as builder

    assert exported is load_swebench and builder is make_swe_env
    assert {"load_swebench", "make_swe_env", "UnsupportedTestIdError"} <= set(swe.__all__)
    assert [name for name in swe.__all__ if not hasattr(swe, name)] == []
