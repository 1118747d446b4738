"""``vt-envs check ID``: a benchmark author's one command, run as a process on a sound
env id and on two broken ones from a module outside the package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import vt_envs

BROKEN = textwrap.dedent(
    """
    from vt_envs import ExactMatch, OraclePolicy, Task, TaskList, ToolEnv, env_builder
    from vt_envs import register_env

    WORDS = ["apple", "river", "stone", "cloud", "maple", "ember"]


    def _tasks(split, gold):
        return TaskList([Task(f"{split}-{i}", f"Repeat {w}.", gold(w)) for i, w in
                         enumerate(WORDS)], name="echo", split=split)


    @env_builder
    def make_wrong(*, split="test", **kw):
        return ToolEnv(tools=[], tasks=_tasks(split, lambda w: w), verifier=ExactMatch(),
                       instructions="Answer in <answer></answer> tags.", **kw)


    @env_builder
    def make_leaky(*, split="test", **kw):  # every gold is what a no-tool policy answers
        return ToolEnv(tools=[], tasks=_tasks(split, lambda w: "unknown"), verifier=ExactMatch(),
                       instructions="Answer in <answer></answer> tags.", **kw)


    class WrongOracle(OraclePolicy):
        def next_action(self, observation, info):
            return "<answer>pear</answer>"


    class RightOracle(OraclePolicy):
        def next_action(self, observation, info):
            return f"<answer>{self.task.gold}</answer>"


    register_env("Broken/Wrong-v0", builder=make_wrong, oracle=WrongOracle, description="x")
    register_env("Broken/Leaky-v0", builder=make_leaky, oracle=RightOracle, description="x")
    """
)


def _vt_envs(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("vt-envs")
    return subprocess.run([str(exe), *argv], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_sound_env_passes_every_check(tmp_path):
    result = _vt_envs("check", "VT-Lookup-v0", "--episodes", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for name in ("check_env", "determinism", "oracle", "junk actions", "no-tool baseline"):
        assert any(line.startswith("PASS") and name in line for line in lines), (name, lines)
    assert lines[-1] == "VT-Lookup-v0: sound"


def test_a_wrong_oracle_and_a_leaky_task_set_fail(tmp_path):
    (tmp_path / "broken.py").write_text(BROKEN)
    wrong = _vt_envs("check", "Broken/Wrong-v0", "--import", "broken", cwd=tmp_path)
    assert wrong.returncode == 1, wrong.stderr[-2000:]
    assert any(line.startswith("FAIL  oracle") for line in wrong.stdout.splitlines())
    leaky = _vt_envs("check", "Broken/Leaky-v0", "--import", "broken.py", cwd=tmp_path)
    assert leaky.returncode == 1, leaky.stderr[-2000:]
    baseline = next(line for line in leaky.stdout.splitlines() if "no-tool baseline" in line)
    assert baseline.startswith("FAIL") and "as good as the oracle" in baseline
    assert "FAILED (no-tool baseline)" in leaky.stdout.splitlines()[-1]


def test_check_from_python_lists_each_registered_shortcut():
    names = [r.name for r in vt_envs.check("VT-Math-v0", episodes=2)]
    assert names[:5] == ["check_env", "determinism", "oracle", "junk actions", "no-tool baseline"]
    assert [n for n in names if n.startswith("shortcut")] == [
        "shortcut product", "shortcut largest", "shortcut sum"]  # fmt: skip
