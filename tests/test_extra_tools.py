"""``extra_tools=``: tools composed into any env id when it is built, by registered
name, by ``{"name": ..., **kwargs}`` or as a Tool, described in the prompt and played
through ``gym.make``; clashes, unknown names and ``tool_server=`` are typed errors."""

from __future__ import annotations

import gymnasium as gym
import pytest
from env_helpers import EchoTool, make_tasks

import vt_envs
from vt_envs.errors import InvalidConfigError, UnknownToolError


def test_a_registered_tool_joins_an_env_by_name_and_runs_sandboxed():
    env = gym.make("VT-Lookup-v0", extra_tools=[{"name": "python", "timeout_s": 5.0}])
    assert sorted(env.unwrapped.tools) == ["lookup", "python"]
    assert env.unwrapped.tools["python"].timeout_s == 5.0
    _, info = env.reset(seed=0)
    assert "python" in info["messages"][0]["content"]  # the prompt describes it
    _, _, _, _, info = env.step("<python>import os; print(6 * 7, os.getuid())</python>")
    assert info["tool"]["ok"] and info["message"]["content"].split()[0] == "42"
    key = env.unwrapped.task.metadata["key"]
    _, _, _, _, info = env.step(f"<lookup>{key}</lookup>")  # the env's own tool still works
    _, reward, terminated, _, _ = env.step(f"<answer>{info['message']['content']}</answer>")
    assert terminated and reward == 1.0
    env.close()


def test_a_tool_object_joins_too_and_the_keyword_is_listed_for_every_id():
    env = gym.make("VT-Lookup-v0", extra_tools=[EchoTool(timeout_s=2.0)])
    env.reset(seed=0)
    _, _, _, _, info = env.step("<echo>hi</echo>")
    assert info["message"]["content"] == "hi"
    env.close()
    for env_id in ("VT-Math-v0", "VT-SQL-v0", "VT-SWE-v0", "VT-Visual-v0"):
        assert "extra_tools" in {k.name for k in vt_envs.keywords(env_id)}


@pytest.mark.parametrize(
    ("extra", "error", "match"),
    [
        (
            [type("Lookup", (EchoTool,), {"name": "lookup"})()],
            InvalidConfigError,
            r"already has the tools \['lookup'\]",
        ),
        (["pyton"], UnknownToolError, "python"),  # did you mean
        ("python", InvalidConfigError, r"extra_tools must be Sequence\[.*got 'python'"),
        ([{"name": "python", "timeout": 5}], InvalidConfigError, "refused"),
        ([42], InvalidConfigError, r"extra_tools must be Sequence\[.*got \[42\]"),
    ],
)
def test_what_cannot_be_composed_is_refused_with_the_fix(extra, error, match):
    with pytest.raises(error, match=match):
        gym.make("VT-Lookup-v0", extra_tools=extra)


def test_extra_tools_do_not_go_with_a_tool_server():
    with pytest.raises(InvalidConfigError, match="own tools only"):
        vt_envs.make("VT-Lookup-v0", extra_tools=["python"], tool_server="http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("extra", "match"), [("python", "must be a list"), ([42], "registered tool's name")]
)
def test_a_tool_env_built_directly_checks_its_extra_tools_too(extra, match):
    """Without an env builder's annotations in front, ToolEnv refuses them itself."""
    with pytest.raises(InvalidConfigError, match=match):
        vt_envs.ToolEnv(tools=[], tasks=make_tasks(), verifier=vt_envs.ExactMatch(),
                        instructions="", extra_tools=extra)  # fmt: skip
