"""VT-Math-v0 end to end: the builder, budgets, observations, reward parts, oracle, baseline.

Needs the sandboxed Python tool; skipped with the reason when it is missing
or no isolation layer works on this machine.
"""

from __future__ import annotations

import json

import pytest

import vt_envs
from vt_envs.errors import SandboxUnavailableError, UnknownKwargError

python_tool = pytest.importorskip(
    "vt_envs.tools.python", reason="VT-Math-v0 needs vt_envs.tools.python (the sandbox tool)"
)
try:
    python_tool.PythonTool()
except SandboxUnavailableError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"no sandbox on this machine: {exc}", allow_module_level=True)

from vt_envs.domains.math import MathNoToolPolicy, MathOracle, make_math_env  # noqa: E402


@pytest.fixture
def env():
    env = make_math_env(split="test")
    yield env
    env.close()


def _start(env, seed=0):
    obs, info = env.reset(seed=seed)
    return env.task, obs, info


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("observation_format", ["inline", "chat"])
def test_oracle_solves_embedded_tasks(split, observation_format):
    env = make_math_env(split=split, observation_format=observation_format)
    results = [vt_envs.run_episode(env, MathOracle(), seed=s) for s in range(6)]
    env.close()
    assert [r.reward for r in results] == [1.0] * 6
    assert all(r.terminated and r.turns == 2 for r in results)


def test_no_tool_baseline_scores_below_the_oracle(env):
    results = [vt_envs.run_episode(env, MathNoToolPolicy(), seed=s) for s in range(10)]
    assert sum(r.reward for r in results) <= 2
    assert all(r.turns == 1 and r.infos[-1]["tool_calls"] == 0 for r in results)


def test_same_seed_same_episode():
    def rollout():
        env = make_math_env()
        run = vt_envs.run_episode(env, MathOracle(), seed=5)
        env.close()
        return run.task_id, run.observations, run.tokens

    assert rollout() == rollout()


def test_inline_output_is_wrapped_in_an_output_block(env):
    _start(env)
    obs, reward, terminated, truncated, info = env.step("<python>print(6 * 7)</python>")
    assert obs["text"] == "\n```output\n42\n```\n"
    assert info["tool"]["name"] == "python" and info["tool"]["ok"]
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_chat_format_sends_a_tool_message_and_accepts_json_calls():
    env = make_math_env(observation_format="chat")
    _start(env)
    call = {"name": "python", "arguments": {"code": "x = 2 ** 10\nprint(x)"}}
    obs, *_ = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert "tool\n1024" in obs["text"]
    obs, *_ = env.step("<python>print(x + 1)</python>")  # state persists across calls
    assert "1025" in obs["text"]
    assert '"name": "python"' in env.system_prompt  # chat describes JSON calls
    env.close()


def test_last_error_line_by_default_full_traceback_as_option():
    for traceback, expected, absent in [
        ("last_line", "Error: ZeroDivisionError: division by zero", "Traceback"),
        ("full", "Traceback", None),
    ]:
        env = make_math_env(traceback=traceback)
        _start(env)
        obs, _, _, _, info = env.step("<python>def f():\n    return 1 / 0\nf()</python>")
        assert expected in obs["text"]
        assert absent is None or absent not in obs["text"]
        assert info["tool"]["ok"] is False and info["tool_errors"] == 1
        env.close()


def test_output_is_truncated_to_max_observation_tokens():
    env = make_math_env(max_observation_tokens=20)
    _start(env)
    obs, *_ = env.step("<python>print('7' * 3000)</python>")
    assert "[output truncated:" in obs["text"]
    assert len(obs["tokens"]) < 80
    env.close()


def test_tool_call_cap_then_only_an_answer_is_accepted():
    env = make_math_env(max_tool_calls=1)
    task, _, _ = _start(env)
    env.step("<python>print(1)</python>")
    obs, reward, terminated, truncated, info = env.step("<python>print(2)</python>")
    assert "You have used all 1 tool calls" in obs["text"]
    assert info["tool_calls"] == 1 and "tool" not in info
    assert not (terminated or truncated)
    _, reward, terminated, _, info = env.step(f"<answer>{task.gold}</answer>")
    assert (reward, terminated) == (1.0, True)
    env.close()


def test_boxed_answer_is_accepted(env):
    task, _, _ = _start(env)
    _, reward, terminated, _, info = env.step(f"So the result is \\boxed{{{task.gold}}}.")
    assert (reward, terminated) == (1.0, True)
    assert info["reward_parts"] == {"outcome": 1.0}
    assert info["verifier_parts"] == {"correct": 1.0}


def test_wrong_answer_scores_zero(env):
    task, _, _ = _start(env)
    _, reward, terminated, _, _ = env.step(f"<answer>{task.gold}1</answer>")
    assert (reward, terminated) == (0.0, True)


def test_tool_output_never_counts_as_the_answer():
    env = make_math_env(max_turns=2)
    task, _, _ = _start(env)
    env.step(f"<python>print({task.gold!r})</python>")
    _, reward, terminated, truncated, _ = env.step(f"<python>print({task.gold!r})</python>")
    assert (reward, terminated, truncated) == (0.0, False, True)
    env.close()


def test_tool_error_penalty_is_a_reward_part():
    env = make_math_env(rewards={"tool_error_penalty": 0.5})
    task, _, _ = _start(env)
    env.step("<python>print(undefined_name)</python>")
    _, reward, _, _, info = env.step(f"<answer>{task.gold}</answer>")
    assert reward == 0.5
    assert info["reward_parts"] == {"outcome": 1.0, "tool_error": -0.5}
    env.close()


def test_missing_answer_penalty_is_a_reward_part():
    env = make_math_env(max_turns=1, rewards={"missing_answer_penalty": 0.25})
    _start(env)
    _, reward, terminated, truncated, info = env.step("<python>print(1)</python>")
    assert (terminated, truncated, info["truncation"]) == (False, True, "max_turns")
    assert reward == -0.25
    assert info["reward_parts"] == {"outcome": 0.0, "missing_answer": -0.25}
    env.close()


def test_stop_strings_include_the_python_and_answer_tags(env):
    assert "</python>" in env.stop_strings and "</answer>" in env.stop_strings


def test_dataset_path_runs_gsm8k_with_the_oracle(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "2 + 2?", "answer": "2+2=4\n#### 4"}) + "\n")
    env = make_math_env(dataset=str(path), split="test", holdout=1.0)
    run = vt_envs.run_episode(env, MathOracle(), seed=0)
    env.close()
    assert (run.task_id, run.reward) == ("gsm8k/test/0", 1.0)


def test_unknown_keyword_is_rejected_with_a_suggestion():
    with pytest.raises(UnknownKwargError, match="max_tool_calls"):
        make_math_env(max_tool_call=2)


def test_code_policy_solves_products_through_gym_make_with_plain_code():
    """The quickstart's SFT teacher: `print(a * b)` as an agent writes it, then the printed line."""
    import gymnasium as gym

    from vt_envs.core.policy import run_episode
    from vt_envs.domains.math.oracle import MathCodePolicy

    env = gym.make("VT-Math-v0", families=["big_product"], difficulty=1)
    policy = MathCodePolicy()
    try:
        for seed in range(5):
            result = run_episode(env, policy, seed=seed)
            task = env.unwrapped.task
            assert result.reward == 1.0 and result.turns == 2
            assert result.actions[0] == f"<python>\n{task.assets['solution_code']}\n</python>"
            assert result.actions[0].startswith("<python>\nprint(")  # plain code, no wrapper
            assert result.actions[1] == f"<answer>{task.gold}</answer>"
    finally:
        env.close()


def test_prestarted_sandboxes_start_at_the_first_reset_and_serve_the_first_call():
    """`prestart=1` through gym.make: the sandbox starts while the policy thinks, and the
    episode's first Python call is handed that very sandbox (no cold start)."""
    import time

    import gymnasium as gym

    env = gym.make("VT-Math-v0", prestart=1, recycle=False)
    try:
        env.reset(seed=0)
        pool = env.unwrapped.tools["python"]._pool
        deadline = time.monotonic() + 10
        while not pool._ready and time.monotonic() < deadline:
            time.sleep(0.02)  # the policy generating its first turn
        (prestarted,) = pool._ready
        _, _, _, _, info = env.step("<python>print(6 * 7)</python>")
        assert info["tool"]["ok"] and "42" in info["message"]["content"]
        assert env.unwrapped._live.sessions["python"].process is prestarted
    finally:
        env.close()


def test_oracle_scores_one_on_every_family_and_level_through_gym_make():
    """Issue 31's harder families are as solvable as the old ones: one task per (family, level)."""
    import gymnasium as gym

    from vt_envs.domains.math import DIFFICULTIES, FAMILIES

    env = gym.make("VT-Math-v0", split="test", python_timeout_s=30.0)
    tasks, want, runs = env.unwrapped.tasks, {(f, d) for f in FAMILIES for d in DIFFICULTIES}, {}
    for i in range(len(tasks)):
        key = (tasks[i].metadata["family"], tasks[i].metadata["difficulty"])
        if key in want and key not in runs:
            runs[key] = vt_envs.run_episode(env, MathOracle(), options={"task_id": tasks[i].id})
        if len(runs) == len(want):
            break
    env.close()
    assert set(runs) == want
    assert {key: run.reward for key, run in runs.items()} == dict.fromkeys(want, 1.0)
