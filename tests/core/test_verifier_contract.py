"""One verifier contract: the env awaits ``averify(task, answer, tools)`` with the
episode's open sessions, under its deadline; what a verifier needs is declared on
its class (``cheap``, ``reads_tools``), and the old probed modes are refused with
the fix instead of being scored another way."""

from __future__ import annotations

import asyncio
import time

import gymnasium as gym
import pytest
from env_helpers import EchoTool, make_tasks

import vt_envs
from vt_envs import ExactMatch, Score, ToolEnv, Verifier, env_builder
from vt_envs.errors import InvalidConfigError

ENV_ID = "VTTest/SessionVerifier-v0"


class CountsEchoCalls(Verifier):
    """Right when the answer is the gold and the episode called echo at least once:
    it grades in the episode's own tool session, as VT-SQL-v0's verifier does."""

    def __init__(self):
        self.seen: list[dict] = []
        self.closed = 0

    async def averify(self, task, answer, tools=vt_envs.core.verifier.NO_TOOLS):
        tool, session = tools["echo"]
        self.seen.append({"tool": tool, "calls": session["calls"], "tools": tools})
        value = float(answer.strip() == task.gold and session["calls"] > 0)
        return Score(value, {"echo_calls": float(session["calls"])})

    async def aclose(self):
        self.closed += 1


@env_builder
def _make(*, split: str = "train", **env_kwargs):
    tool = EchoTool(timeout_s=2.0)
    return ToolEnv(tools=[tool], tasks=make_tasks(split=split), verifier=CountsEchoCalls(),
                   instructions="Echo, then answer.", name=ENV_ID, **env_kwargs)  # fmt: skip


@pytest.fixture
def env_id(register_temporary):
    register_temporary(ENV_ID, builder=_make)
    return ENV_ID


def test_the_verifier_grades_in_the_episodes_open_sessions_through_gym_make(env_id):
    env = gym.make(env_id)
    verifier = env.unwrapped.verifier
    env.reset(seed=0, options={"task_id": "t3"})
    assert env.step("<answer>21</answer>")[1] == 0.0  # no echo call: its session says so
    env.reset(seed=0, options={"task_id": "t3"})
    env.step("<echo>hello</echo>")
    _, reward, done, _, info = env.step("<answer>21</answer>")
    assert done and reward == 1.0 and info["verifier_parts"] == {"echo_calls": 1.0}
    assert [s["calls"] for s in verifier.seen] == [0, 1]
    assert verifier.seen[1]["tool"] is env.unwrapped.tools["echo"]
    with pytest.raises(TypeError):  # read-only: a verifier cannot swap the episode's tools
        verifier.seen[1]["tools"]["echo"] = None
    env.close()
    assert verifier.closed == 1  # the env awaits every verifier's aclose


def test_the_deadline_applies_to_averify_and_to_a_threaded_score():
    class SlowAsync(Verifier):
        async def averify(self, task, answer, tools=vt_envs.core.verifier.NO_TOOLS):
            await asyncio.sleep(30)
            return Score(1.0)

    class SlowScore(Verifier):
        def score(self, task, answer):
            time.sleep(1.5)
            return Score(1.0)

    for verifier in (SlowAsync(), SlowScore()):
        env = ToolEnv(tools=[EchoTool()], tasks=make_tasks(), verifier=verifier,
                      instructions="", verify_timeout_s=0.2)  # fmt: skip
        env.reset(options={"task_id": "t1"})
        started = time.monotonic()
        _, reward, _, _, info = env.step("<answer>7</answer>")
        assert reward == 0.0 and info["verifier_parts"] == {"timeout": 1.0}, verifier
        assert time.monotonic() - started < 1.0
        env.close()


def test_calling_a_verifier_scores_outside_an_episode():
    assert ExactMatch()(make_tasks()[2], "14").value == 1.0
    assert CountsEchoCalls.score is Verifier.score  # averify only: run on VT's loop
    with pytest.raises(KeyError):  # no episode, so no tools to grade in
        CountsEchoCalls()(make_tasks()[2], "14")


def test_the_old_probed_modes_are_refused_with_the_fix():
    with pytest.raises(TypeError, match="override score"):

        class Inline(ExactMatch):
            inline = True

    with pytest.raises(TypeError, match="override score"):

        class CallOnly(ExactMatch):
            def __call__(self, task, answer):
                return Score(1.0)

    class Duck:  # the pre-contract shape: averify + uses_tool_sessions, no base class
        uses_tool_sessions = True

        async def averify(self, task, answer, *, sessions=None):
            return Score(1.0)

        def __call__(self, task, answer):
            return Score(1.0)

    for given in (Duck(), "exact"):
        with pytest.raises(InvalidConfigError, match=r"Subclass vt_envs\.Verifier"):
            ToolEnv(tools=[], tasks=make_tasks(), verifier=given, instructions="")
    env = ToolEnv(tools=[], tasks=make_tasks(), verifier=ExactMatch(), instructions="")
    with pytest.raises(InvalidConfigError):  # assigning later goes through the same check
        env.verifier = Duck()
    env.close()
