"""ToolEnv: the episode contract (rewards, budgets, info, errors)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from env_helpers import EchoTool, make_tasks

from vt_envs import ExactMatch, RewardConfig, Task, ToolEnv
from vt_envs.errors import (
    AsyncContextError,
    EnvClosedError,
    InvalidConfigError,
    ResetNeededError,
    UnknownTaskError,
)


def make_env(tool: EchoTool | None = None, **kwargs) -> ToolEnv:
    return ToolEnv(
        tools=[tool or EchoTool(timeout_s=2.0)],
        tasks=make_tasks(),
        verifier=ExactMatch(),
        instructions="Answer with the number in the question.",
        render_mode="ansi",
        **kwargs,
    )


def test_answer_terminates_with_outcome_reward():
    env = make_env()
    obs, info = env.reset(options={"task_id": "t3"})
    assert info["task_id"] == "t3" and info["turn"] == 0 and info["parse"] is None
    assert obs["text"].endswith("<|im_start|>assistant\n")
    obs, reward, terminated, truncated, info = env.step("I think <answer>21</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_parts"] == {"outcome": 1.0}
    assert info["parse"]["kind"] == "answer"
    assert obs["tokens"].dtype == np.int64 and len(obs["tokens"]) == 0


def test_wrong_answer_scores_zero():
    env = make_env()
    env.reset(options={"task_id": "t3"})
    _, reward, terminated, _, info = env.step("<answer>22</answer>")
    assert reward == 0.0 and terminated and info["reward_parts"]["outcome"] == 0.0


def test_tool_call_output_becomes_the_observation():
    tool = EchoTool()
    env = make_env(tool)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<echo>hello</echo>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs["text"] == "<|im_end|>\n<|im_start|>tool\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert env.tokenizer.decode(obs["tokens"].tolist()) == obs["text"]
    assert info["tool"]["name"] == "echo" and info["tool"]["ok"] is True
    assert info["tool"]["latency_s"] >= 0.0
    assert info["message"] == {"role": "tool", "content": "hello"}
    assert info["tool_calls"] == 1 and tool.opened[-1]["calls"] == 1


def test_action_ending_with_eos_gets_only_the_rest_of_the_boundary():
    env = make_env()
    env.reset(seed=0)
    obs, *_ = env.step("<echo>hi</echo><|im_end|>")
    assert obs["text"] == "\n<|im_start|>tool\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_token_id_actions_are_decoded_not_retokenized():
    env = make_env()
    env.reset(options={"task_id": "t1"})
    ids = env.tokenizer.encode("<answer>7</answer>")
    _, reward, terminated, _, _ = env.step(np.array(ids, dtype=np.int64))
    assert reward == 1.0 and terminated


def test_invalid_action_is_an_observation_and_counted():
    env = make_env()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("no tags at all")
    assert not terminated and not truncated and reward == 0.0
    assert info["parse"]["kind"] == "invalid" and info["invalid_actions"] == 1
    assert "<echo>" in info["message"]["content"]  # tells the agent the accepted forms


def test_tool_failure_exception_and_timeout_are_observations():
    env = make_env(EchoTool(timeout_s=0.2))
    env.reset(seed=0)
    _, _, _, _, info = env.step("<echo>fail</echo>")
    assert info["tool"]["ok"] is False and info["tool"]["error"] == "asked"
    _, _, _, _, info = env.step("<echo>raise</echo>")
    assert info["tool"]["error"] == "internal_error"
    assert "RuntimeError" in info["message"]["content"]
    _, _, done, trunc, info = env.step("<echo>nap 5</echo>")  # the tool's own timeout
    assert info["tool"]["error"] == "timeout" and "timed out" in info["message"]["content"]
    assert info["tool"]["latency_s"] < 0.25  # not the backstop's 0.2 + 0.3 s
    _, _, done, trunc, info = env.step("<echo>sleep 5</echo>")  # only the backstop stops it
    assert info["tool"]["error"] == "timeout" and "was stopped" in info["message"]["content"]
    assert 0.45 < info["tool"]["latency_s"] < 2.0
    assert not done and not trunc and info["tool_errors"] == 4
    _, _, _, _, info = env.step("<echo>after</echo>")
    assert info["tool"]["ok"] and info["message"]["content"] == "after"


def test_max_turns_truncates_and_closes_sessions():
    tool = EchoTool()
    env = make_env(tool, max_turns=2)
    env.reset(seed=0)
    env.step("<echo>a</echo>")
    obs, reward, terminated, truncated, info = env.step("<echo>b</echo>")
    assert truncated and not terminated and info["truncation"] == "max_turns"
    assert info["reward_parts"] == {"outcome": 0.0}
    assert tool.closed == tool.opened  # the session was released at episode end
    with pytest.raises(ResetNeededError, match="after the episode ended"):
        env.step("<answer>1</answer>")


def test_token_budget_truncates():
    env = make_env(max_episode_tokens=150)
    obs, info = env.reset(seed=0)
    assert info["episode_tokens"] == len(obs["tokens"]) < 150
    _, _, _, truncated, info = env.step("<echo>" + "word " * 100 + "</echo>")
    assert truncated and info["truncation"] == "max_episode_tokens"


def test_wall_clock_budget_caps_tool_time_and_truncates():
    env = make_env(EchoTool(timeout_s=30), max_episode_seconds=0.3)
    env.reset(seed=0)
    _, _, _, truncated, info = env.step("<echo>sleep 10</echo>")
    assert info["tool"]["error"] == "timeout" and info["tool"]["latency_s"] < 5
    assert truncated and info["truncation"] == "max_episode_seconds"


def test_tool_call_cap_then_only_answers():
    env = make_env(max_tool_calls=1)
    env.reset(options={"task_id": "t2"})
    env.step("<echo>one</echo>")
    _, _, _, _, info = env.step("<echo>two</echo>")
    assert "used all 1 tool calls" in info["message"]["content"]
    assert info["tool_calls"] == 1 and info["invalid_actions"] == 1
    _, reward, terminated, _, _ = env.step("<answer>14</answer>")
    assert terminated and reward == 1.0


def test_reward_shaping_is_broken_down():
    rewards = RewardConfig(
        invalid_action_penalty=0.1, tool_error_penalty=0.5, missing_answer_penalty=1.0
    )
    env = make_env(rewards=rewards, max_turns=3)
    env.reset(options={"task_id": "t0"})
    env.step("junk")
    env.step("<echo>fail</echo>")
    _, reward, _, truncated, info = env.step("more junk")
    assert truncated
    assert info["reward_parts"] == pytest.approx(
        {"outcome": 0.0, "invalid_action": -0.2, "tool_error": -0.5, "missing_answer": -1.0}
    )
    assert reward == pytest.approx(-1.7)


def test_reward_shaping_cap():
    env = make_env(rewards={"invalid_action_penalty": 1.0, "max_penalty": 0.5}, max_turns=2)
    env.reset(options={"task_id": "t0"})
    env.step("junk")
    _, reward, _, _, info = env.step("<answer>0</answer>")
    assert reward == pytest.approx(0.5) and info["reward_parts"]["invalid_action"] == -0.5


def test_inline_task_and_unknown_task_id():
    env = make_env()
    _, info = env.reset(options={"task": Task(id="mine", prompt="Say 5.", gold="5")})
    assert info["task_id"] == "mine"
    with pytest.raises(UnknownTaskError, match="'t33' is not in task source") as err:
        env.reset(options={"task_id": "t33"})
    assert "Did you mean" in str(err.value)


def test_same_seed_same_task_sequence():
    a, b = make_env(), make_env()
    ids_a = [a.reset(seed=7)[1]["task_id"]] + [a.reset()[1]["task_id"] for _ in range(4)]
    ids_b = [b.reset(seed=7)[1]["task_id"]] + [b.reset()[1]["task_id"] for _ in range(4)]
    assert ids_a == ids_b and len(set(ids_a)) > 1


def test_render_ansi_is_the_decoded_token_stream():
    env = make_env()
    obs, _ = env.reset(seed=0)
    ids = obs["tokens"].tolist()
    for action in ("<echo>x y</echo>", "<answer>0</answer>"):
        ids += env.tokenizer.encode(action)
        obs, *_ = env.step(action)
        ids += obs["tokens"].tolist()
    assert env.render() == env.tokenizer.decode(ids)


def test_sync_call_from_a_thread_running_its_own_loop_works():
    # Jupyter runs an event loop on the main thread; env.step must still work there.
    env = make_env()

    async def notebook_cell():
        env.reset(options={"task_id": "t1"})
        return env.step("<answer>7</answer>")

    _, reward, terminated, _, _ = asyncio.run(notebook_cell())
    assert reward == 1.0 and terminated


def test_sync_call_on_the_library_loop_names_the_coroutine():
    from vt_envs.core.loop import submit

    env = make_env()

    async def misuse():
        env.reset(seed=0)

    with pytest.raises(AsyncContextError, match=r"await areset"):
        submit(misuse()).result(timeout=10)


@pytest.mark.asyncio
async def test_async_api_in_user_loop():
    env = make_env()
    obs, info = await env.areset(options={"task_id": "t4"})
    obs, reward, terminated, *_ = await env.astep("<answer>28</answer>")
    assert reward == 1.0 and terminated
    await env.aclose()


def test_step_before_reset_close_twice_and_use_after_close():
    env = make_env()
    with pytest.raises(ResetNeededError, match="before reset"):
        env.step("<answer>1</answer>")
    env.close()
    env.close()
    with pytest.raises(EnvClosedError):
        env.reset()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_turns": 0}, "max_turns must be an int >= 1, got 0"),
        ({"observation_format": "xml"}, "observation_format must be one of ['chat', 'inline']"),
        ({"action_format": "yaml"}, "action_format must be one of ['tags', 'json'], got 'yaml'"),
        ({"rewards": {"tool_error_penalty": -1}}, "penalty magnitude and must be >= 0"),
    ],
)
def test_config_errors_name_the_value(kwargs, message):
    with pytest.raises(InvalidConfigError) as err:
        make_env(**kwargs)
    assert message in str(err.value)


def test_long_tool_output_is_capped_with_a_note():
    env = make_env(max_observation_tokens=10)
    env.reset(seed=0)
    _, _, _, _, info = env.step("<echo>" + "abc " * 200 + "</echo>")
    assert "[output truncated:" in info["message"]["content"]


def test_json_action_format_prompt_lists_function_specs():
    env = make_env(action_format="json")
    obs, _ = env.reset(seed=0)
    assert '"name": "echo"' in obs["text"] and "<tool_call>" in obs["text"]
    _, _, _, _, info = env.step(
        '<tool_call>{"name": "echo", "arguments": {"text": "j"}}</tool_call>'
    )
    assert info["message"]["content"] == "j"


def test_a_cheap_verifier_runs_on_the_loop_and_any_other_in_a_thread():
    from vt_envs.core.loop import on_library_loop

    seen: dict[str, bool] = {}

    class Recording(ExactMatch):
        def __init__(self, name: str):
            super().__init__()
            self.name = name

        def score(self, task, answer):
            seen[self.name] = on_library_loop()
            return super().score(task, answer)

    class Threaded(Recording):
        cheap = False

    def plain(task, answer):
        seen["function"] = on_library_loop()
        return ExactMatch().score(task, answer)

    for verifier in (Recording("cheap"), Threaded("threaded"), plain):
        env = ToolEnv(
            tools=[EchoTool(timeout_s=2.0)],
            tasks=make_tasks(),
            verifier=verifier,
            instructions="Answer.",
        )
        env.reset(options={"task_id": "t3"})
        assert env.step("<answer>21</answer>")[1] == 1.0
        env.close()
    assert seen == {"cheap": True, "threaded": False, "function": False}


@pytest.mark.parametrize("keyword", ["max_episode_seconds", "verify_timeout_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0], ids=repr)
def test_a_tool_env_built_directly_checks_its_deadlines(keyword, value):
    """Not only gym.make's keywords: ToolEnv itself refuses a deadline that is not one
    (None still means no limit)."""
    with pytest.raises(InvalidConfigError, match=keyword):
        make_env(**{keyword: value})
    make_env(**{keyword: None}).close()


def _record_tokenizer(monkeypatch, tokenizer) -> list[int]:
    """Wrap the env's tokenizer: the sizes of every input it encodes or decodes."""
    sizes: list[int] = []
    for name in ("encode", "encode_text", "decode"):
        inner = getattr(tokenizer, name)

        def recorded(value, inner=inner):
            sizes.append(len(value))
            return inner(value)

        monkeypatch.setattr(tokenizer, name, recorded)
    return sizes


@pytest.mark.parametrize("kind", ["text", "ids"])
def test_an_action_over_the_token_budget_is_never_tokenized_in_full(monkeypatch, kind):
    """A 10 MB action (or 10M ids) ends the episode truncated by the token budget, and
    the tokenizer sees at most what the budget allows (the room left, in tokens, times
    the most characters one token stands for), not 10 MB."""
    import gymnasium as gym

    env = gym.make("VT-Lookup-v0")
    _, info = env.reset(seed=0)
    unwrapped = env.unwrapped
    room = unwrapped.max_episode_tokens - info["episode_tokens"]
    sizes = _record_tokenizer(monkeypatch, unwrapped.tokenizer)
    action = "<lookup>1</lookup>" * 600_000 if kind == "text" else np.full(10**7, 64)
    obs, reward, terminated, truncated, info = env.step(action)
    assert truncated and not terminated and info["truncation"] == "max_episode_tokens"
    assert info["episode_tokens"] == unwrapped.max_episode_tokens + 1
    assert info["parse"] is None and "tool" not in info and info["tool_calls"] == 0
    assert reward == 0.0 and len(obs["tokens"]) == 0
    assert max(sizes, default=0) <= (room + 1) * unwrapped.tokenizer.max_chars_per_token
    env.close()


def test_an_answer_over_the_token_budget_is_not_graded():
    """Like a generation cut at a length limit: no context the budget allows holds it."""
    env = make_env(max_episode_tokens=200)
    env.reset(options={"task_id": "t3"})
    _, reward, terminated, truncated, info = env.step("x " * 5000 + "<answer>3</answer>")
    assert truncated and not terminated and info["truncation"] == "max_episode_tokens"
    assert info["reward_parts"] == {"outcome": 0.0}


def test_an_action_that_fits_is_counted_exactly():
    env = make_env(max_episode_tokens=400)
    _, info = env.reset(options={"task_id": "t3"})
    before = info["episode_tokens"]
    action = "<echo>hi</echo>" + " x" * ((400 - before) // 4)  # well within the budget
    n = len(env.tokenizer.encode(action))
    obs, _, _, truncated, info = env.step(action)
    assert not truncated and info["parse"]["kind"] == "tool_call"
    assert info["episode_tokens"] == before + n + len(obs["tokens"])
