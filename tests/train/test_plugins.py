"""User code outside the package, by name: a module in a temporary directory
registers an advantage estimator and an env id; ``vt-train`` (and ``vt-train
resume``, from another directory) and ``vt-bench eval`` use them without any
edit to VT, as separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

USER_MODULE = textwrap.dedent(
    '''
    """A user's extension: an advantage estimator and an env, registered on import."""
    import os

    import torch

    from vt_envs import ExactMatch, OraclePolicy, Task, TaskList, ToolEnv, env_builder
    from vt_envs import register_env
    from vt_train.algorithms import register_advantage

    WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "tulip", "coral"]


    @register_advantage("median_baseline", group_based=True)
    def median_baseline(rewards, mask, group_ids, config, values=None, token_rewards=None):
        with open(os.environ["CALLS_FILE"], "a") as f:  # the test counts the calls
            f.write("call\\n")
        baseline = torch.stack([rewards[group_ids == g].median() for g in group_ids])
        advantages = (rewards - baseline)[:, None] * mask
        return advantages, advantages


    @env_builder
    def make_echo_env(*, split="train", **env_kwargs):
        tasks = TaskList(
            [Task(f"{split}-{i}", f"Repeat the word {w}.", w) for i, w in enumerate(WORDS)],
            name="echo",
            split=split,
        )
        return ToolEnv(tools=[], tasks=tasks, verifier=ExactMatch(),
                       instructions="Answer in <answer></answer> tags.", **env_kwargs)


    class EchoOracle(OraclePolicy):
        def next_action(self, observation, info):
            return f"<answer>{self.task.gold}</answer>"


    register_env("MyOrg/Echo-v0", builder=make_echo_env, oracle=EchoOracle,
                 description="repeat a word")
    '''
)

RECIPE = {
    "algo": "grpo",
    "algorithm": {"advantage": "median_baseline"},
    "env": {"id": "MyOrg/Echo-v0", "eval_episodes": 2},
    "model": {
        "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                 "intermediate_size": 64},
    },
    "rollout": {"engine": "hf", "tasks_per_step": 2, "n": 2, "max_new_tokens": 8,
                "max_context": 512, "sync_check": False},
    "optim": {"minibatch_size": 4, "micro_batch_size": 4},
    "deepspeed": {"zero_stage": 0, "bf16": False, "torch_adam": True},
    "steps": 1,
    "tensorboard": False,
    "output_dir": "run",
}  # fmt: skip


def _run(args: list[str], cwd: Path, calls: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CALLS_FILE": str(calls), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the user's module is found from the cwd or its path only
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def test_a_user_module_registers_an_advantage_and_an_env_that_train_resume_and_eval_use(
    tmp_path,
):
    user = tmp_path / "user"
    user.mkdir()
    (user / "my_ext.py").write_text(USER_MODULE)
    (user / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    calls = tmp_path / "calls.txt"

    _run([_bin("vt-train"), "recipe.yaml", "--import", "my_ext.py"], user, calls)
    run_dir = user / "run"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["imports"] == [str(user / "my_ext.py")]  # absolute: resume finds it anywhere
    assert saved["algorithm"]["advantage"] == "median_baseline"
    assert saved["algorithm"]["clip_high"] == 0.2  # the preset's fields, resolved
    assert calls.read_text().count("call") == 1

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run([_bin("vt-train"), "resume", str(run_dir), "steps=2"], elsewhere, calls)
    assert calls.read_text().count("call") == 2  # the resumed step used it again
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "step" in m][-1] == 2

    out = tmp_path / "eval"
    _run([_bin("vt-bench"), "eval", "MyOrg/Echo-v0", "--import", "my_ext", "--policy",
          "oracle", "--tasks", "4", "--no-progress", "--out", str(out)], user, calls)  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["envs"]["MyOrg/Echo-v0"]["accuracy"] == 1.0
    _run([_bin("vt-bench"), "eval", "--resume", str(out), "--no-progress"], user, calls)


def test_module_attr_names_an_estimator_and_a_missing_plugin_is_a_typed_error(
    tmp_path, monkeypatch
):
    from vt_envs.core.plugins import import_plugins
    from vt_envs.errors import InvalidConfigError, UnknownNameError
    from vt_train.algorithms.advantages import ADVANTAGES
    from vt_train.config import load_config

    (tmp_path / "other_ext.py").write_text(
        "from vt_train.algorithms import register_advantage\n"
        "@register_advantage('other_zero')\n"
        "def other_zero(rewards, mask, group_ids, config, values=None, token_rewards=None):\n"
        "    return rewards[:, None] * mask * 0, rewards[:, None] * mask * 0\n"
    )
    monkeypatch.chdir(tmp_path)
    # The registration must not outlive this test: other tests list the known names.
    monkeypatch.setattr(ADVANTAGES, "_items", dict(ADVANTAGES._items))
    estimator = ADVANTAGES.get("other_ext:other_zero")  # imported from the cwd by name
    assert estimator is ADVANTAGES.get("other_zero")
    with pytest.raises(UnknownNameError, match="imports: \\[my_module\\]"):
        ADVANTAGES.get("no_such_estimator")
    with pytest.raises(InvalidConfigError, match="cannot import plugin 'not_a_module_xyz'"):
        import_plugins(["not_a_module_xyz"])
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_config(None, ["imports=[./missing.py]"])
    with pytest.raises(InvalidConfigError, match="unknown config key 'improts'"):
        load_config(None, ["improts=[x]"])
