"""gym.make returns the VT env itself; through Gymnasium's wrappers the async API is
vt_envs.areset/astep/aclose (each wrapper's async twin runs), and Gymnasium's classes
gain nothing."""

from __future__ import annotations

import gymnasium as gym
import pytest
from env_helpers import EchoTool, make_tasks
from gymnasium.error import ResetNeeded

import vt_envs
from vt_envs import ExactMatch, ToolEnv
from vt_envs.core.wrappers import AsyncTwin, register_async_twin
from vt_envs.errors import AsyncWrapperError, ResetNeededError


def test_gym_make_returns_the_env_and_gymnasium_is_not_patched():
    env = gym.make("VT-Lookup-v0")
    assert type(env) is ToolEnv and env.unwrapped is env  # its async API is its own
    for name in ("areset", "astep", "aclose", "stop_strings"):
        assert not hasattr(gym.Wrapper, name), name  # no attribute added for everyone
    with pytest.raises(ResetNeededError):  # what OrderEnforcing did, the env does itself
        env.step("<answer>1</answer>")
    env.close()


@pytest.mark.asyncio
async def test_the_async_api_goes_through_gymnasiums_wrappers():
    env = gym.make("VT-Lookup-v0", disable_env_checker=False)  # the passive checker
    checker = env
    assert isinstance(checker, gym.wrappers.PassiveEnvChecker)
    assert vt_envs.stop_strings(env) == env.unwrapped.stop_strings
    obs, info = await vt_envs.areset(env, seed=0)
    assert checker.checked_reset  # the passive checker ran on the awaited reset
    key = env.unwrapped.task.metadata["key"]
    obs, reward, terminated, truncated, info = await vt_envs.astep(env, f"<lookup>{key}</lookup>")
    assert checker.checked_step  # ... and on the awaited step
    value = info["message"]["content"]
    _, reward, terminated, _, _ = await vt_envs.astep(env, f"<answer>{value}</answer>")
    assert reward == 1.0 and terminated
    ordered = gym.wrappers.OrderEnforcing(vt_envs.make("VT-Lookup-v0"))
    with pytest.raises(ResetNeeded):  # OrderEnforcing's own check, awaited
        await vt_envs.astep(ordered, "<answer>1</answer>")
    await vt_envs.aclose(env)
    await vt_envs.aclose(ordered)


@pytest.mark.asyncio
async def test_the_passive_checker_catches_a_bad_awaited_step():
    class BadReward(ToolEnv):
        async def astep(self, action):
            obs, _, terminated, truncated, info = await super().astep(action)
            return obs, 0.0, terminated, truncated, "not a dict"

    env = gym.wrappers.PassiveEnvChecker(
        BadReward(tools=[EchoTool()], tasks=make_tasks(), verifier=ExactMatch(), instructions="")
    )
    await vt_envs.areset(env, seed=0)
    with pytest.raises(AssertionError, match="must be a python dictionary"):
        await vt_envs.astep(env, "<echo>x</echo>")


def _time_limited(n: int, tool: EchoTool) -> gym.Env:
    env = gym.wrappers.TimeLimit(
        ToolEnv(tools=[tool], tasks=make_tasks(), verifier=ExactMatch(), instructions=""), n
    )
    return env


@pytest.mark.parametrize("run", ["sync", "async"])
def test_max_episode_steps_ends_the_episode_like_the_env_budgets(run):
    import asyncio

    tool = EchoTool()
    env = _time_limited(2, tool)
    assert env.unwrapped._turn_limit() == 2

    async def play():
        await vt_envs.areset(env, seed=0)
        await vt_envs.astep(env, "<echo>a</echo>")
        return await vt_envs.astep(env, "<echo>b</echo>")

    if run == "sync":
        env.reset(seed=0)
        env.step("<echo>a</echo>")
        result = env.step("<echo>b</echo>")
    else:
        result = asyncio.run(play())
    _, reward, terminated, truncated, info = result
    assert truncated and not terminated and info["truncation"] == "max_episode_steps"
    assert info["reward_parts"] == {"outcome": 0.0}
    assert tool.closed == tool.opened  # the sessions were closed on that step


def test_gym_make_max_episode_steps_reaches_the_env():
    env = gym.make("VT-Lookup-v0", max_episode_steps=1)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("thinking")
    assert truncated and info["truncation"] == "max_episode_steps" and "reward_parts" in info
    assert env.spec.max_episode_steps == 1


@pytest.mark.asyncio
async def test_a_wrapper_without_an_async_twin_is_named():
    class Doubler(gym.Wrapper):
        def step(self, action):
            obs, reward, *rest = self.env.step(action)
            return obs, 2 * reward, *rest

    env = Doubler(vt_envs.make("VT-Lookup-v0"))
    await vt_envs.areset(env, seed=0)  # reset is not overridden: forwarded
    with pytest.raises(AsyncWrapperError, match=r"Doubler .* overrides step"):
        await vt_envs.astep(env, "<answer>1</answer>")

    async def astep(wrapper, action):
        obs, reward, *rest = await vt_envs.astep(wrapper.env, action)
        return obs, 2 * reward, *rest

    register_async_twin(Doubler, AsyncTwin(astep=astep))
    key = env.unwrapped.task.metadata["key"]
    _, _, _, _, info = await vt_envs.astep(env, f"<lookup>{key}</lookup>")
    _, reward, *_ = await vt_envs.astep(env, f"<answer>{info['message']['content']}</answer>")
    assert reward == 2.0
    await vt_envs.aclose(env)


@pytest.mark.asyncio
async def test_record_episode_statistics_counts_awaited_steps():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("VT-Lookup-v0"))
    await vt_envs.areset(env, seed=0)
    _, _, _, _, info = await vt_envs.astep(env, "<answer>nope</answer>")
    assert info["episode"]["l"] == 1 and env.episode_count == 1
    await vt_envs.aclose(env)


@pytest.mark.asyncio
async def test_arun_episode_plays_through_wrappers():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("VT-Lookup-v0", max_episode_steps=4))
    result = await vt_envs.arun_episode(env, vt_envs.oracle_for("VT-Lookup-v0"), seed=0)
    assert result.reward == 1.0 and result.terminated
    assert result.infos[-1]["episode"]["l"] == 2  # the statistics wrapper counted both steps
    await vt_envs.aclose(env)
