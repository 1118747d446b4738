"""Worked examples: rendered in the env's formats, parsed back, placed before the task.

Through ``gym.make`` on VT-Lookup-v0 (its two demonstrations) and on a
ToolEnv with a JSON-only tool; a demonstration the env's parser would reject
fails when the env is built, not in the middle of a training run.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.core.examples import ExampleCall, WorkedExample, coerce_examples
from vt_envs.core.policy import run_episode
from vt_envs.domains.lookup import EXAMPLES, LookupOracle
from vt_envs.errors import InvalidConfigError


def _roles(messages):
    return [m["role"] for m in messages]


def test_lookup_prompt_holds_the_examples_as_chat_turns_before_the_task():
    env = gym.make("VT-Lookup-v0")
    obs, info = env.reset(seed=0)
    roles = _roles(info["messages"])
    assert roles == ["system", *["user", "assistant", "tool", "assistant"] * 2, "user"]
    assert info["messages"][2]["content"] == "<lookup>123</lookup>"
    assert info["messages"][3]["content"] == "456"
    assert info["messages"][4]["content"] == "<answer>456</answer>"
    assert info["messages"][-1]["content"] == env.unwrapped.task.prompt
    text = obs["text"]
    assert text.index("<lookup>908</lookup>") < text.index(env.unwrapped.task.prompt)
    # The examples are prompt tokens: the episode budget counts them.
    assert info["episode_tokens"] == len(obs["tokens"])
    bare = gym.make("VT-Lookup-v0", examples=[])
    bare_obs, bare_info = bare.reset(seed=0)
    assert _roles(bare_info["messages"]) == ["system", "user"]
    assert len(bare_obs["tokens"]) < len(obs["tokens"])
    assert "<lookup>" not in bare_obs["text"].split("<|im_start|>user")[1]


def test_examples_change_neither_tasks_nor_rewards():
    """Same seed, same task sequence and the oracle's reward, with and without examples."""
    for examples in (EXAMPLES, []):
        env = gym.make("VT-Lookup-v0", split="test", examples=examples)
        results = [run_episode(env, LookupOracle(), seed=seed) for seed in range(3)]
        tasks = [r.task_id for r in results]
        assert [r.reward for r in results] == [1.0, 1.0, 1.0]
        if examples:
            with_examples = tasks
    assert tasks == with_examples


def test_inline_and_json_formats_render_what_the_parser_reads():
    env = gym.make("VT-Lookup-v0", observation_format="inline", action_format="json")
    _, info = env.reset(seed=0)
    assert _roles(info["messages"]) == ["system", "user", "assistant", "user", "assistant", "user"]
    demo = info["messages"][2]["content"]
    assert demo == (
        '<tool_call>{"name": "lookup", "arguments": {"key": "123"}}</tool_call>'
        "<result>\n456\n</result>\n<answer>456</answer>"
    )


def test_multiline_code_is_tagged_on_its_own_lines_and_parses_back():
    code = "x = 6\nprint(x * 7)"
    example = WorkedExample("Compute 6 * 7.", (ExampleCall("python", {"code": code}, "42"),), "42")
    env = vt_envs.make("VT-Math-v0", examples=[example])
    try:
        _, info = env.reset(seed=0)
        assert f"<python>\n{code}\n</python>" in info["messages"][2]["content"]
    finally:
        env.close()


@pytest.mark.parametrize(
    ("example", "match"),
    [
        (
            WorkedExample("q", (ExampleCall("search", {"query": "x"}, "y"),), "z"),
            "not a tool of this env",
        ),
        (
            WorkedExample("q", (ExampleCall("lookup", {"name": "123"}, "456"),), "456"),
            "does not parse back",
        ),
        (  # the tag ends early: the env would run lookup("1"), not what the example shows
            WorkedExample("q", (ExampleCall("lookup", {"key": "1</lookup>2"}, "456"),), "456"),
            "does not parse back",
        ),
        (WorkedExample("q", (), "  "), "does not parse back as an answer"),
    ],
)
def test_a_demonstration_the_env_would_reject_fails_at_construction(example, match):
    with pytest.raises(InvalidConfigError, match=match):
        gym.make("VT-Lookup-v0", examples=[example])


def test_examples_from_yaml_mappings():
    given = [
        {
            "question": "What is the value of key 555?",
            "calls": [{"tool": "lookup", "arguments": {"key": "555"}, "output": "777"}],
            "answer": "777",
        }
    ]
    env = gym.make("VT-Lookup-v0", examples=given)
    _, info = env.reset(seed=0)
    assert info["messages"][2]["content"] == "<lookup>555</lookup>"
    assert coerce_examples(given) == (
        WorkedExample(
            "What is the value of key 555?", (ExampleCall("lookup", {"key": "555"}, "777"),), "777"
        ),
    )
    for bad in ({"question": "q"}, [{"question": "q", "answer": "a", "calls": [{"tool": "x"}]}]):
        with pytest.raises(InvalidConfigError, match=r"worked example|examples must"):
            coerce_examples(bad)
