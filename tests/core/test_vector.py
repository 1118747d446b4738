"""ToolVectorEnv: Gymnasium batch semantics and trajectory-level asynchrony."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest

import vt_envs
from vt_envs import ToolVectorEnv
from vt_envs.domains.lookup import make_lookup_env


def test_make_vec_batches_and_autoresets_next_step():
    venv = gym.make_vec("VT-Lookup-v0", num_envs=3)
    assert isinstance(venv, ToolVectorEnv)
    obs, infos = venv.reset(seed=0)
    assert len(obs["tokens"]) == 3 and all(t.dtype == np.int64 for t in obs["tokens"])
    assert list(infos["task_id"]) == [
        vt_envs.make("VT-Lookup-v0").reset(seed=s)[1]["task_id"] for s in range(3)
    ]
    keys = [venv.envs[i].task.metadata["key"] for i in range(3)]
    obs, rewards, term, trunc, infos = venv.step([f"<lookup>{k}</lookup>" for k in keys])
    values = list(infos["message"]["content"])  # vector infos: dict of arrays
    # sub-env 1 answers wrong, the others right
    answers = [f"<answer>{v}</answer>" for v in values]
    answers[1] = "<answer>nope</answer>"
    obs, rewards, term, trunc, infos = venv.step(answers)
    assert rewards.tolist() == [1.0, 0.0, 1.0] and term.all() and not trunc.any()
    # next step: every finished sub-env resets and ignores the action
    obs, rewards, term, trunc, infos = venv.step(["ignored"] * 3)
    assert rewards.tolist() == [0.0, 0.0, 0.0] and not term.any()
    assert all(text.endswith("<|im_start|>assistant\n") for text in obs["text"])
    assert all(turn == 0 for turn in infos["turn"])
    venv.close()


def test_step_async_returns_before_the_slow_tool_finishes():
    venv = ToolVectorEnv([lambda: make_lookup_env(tool_delay_s=0.5) for _ in range(2)])
    venv.reset(seed=0)
    venv.step_async(["<lookup>1</lookup>", "<lookup>2</lookup>"])
    pending = venv._pending
    assert pending is not None and not pending.done()  # step_async did not block
    _, _, _, _, infos = venv.step_wait()
    assert list(infos["tool_calls"]) == [1, 1]
    venv.close()


@pytest.mark.asyncio
async def test_a_slow_tool_in_one_trajectory_does_not_delay_the_others():
    slow = make_lookup_env(tool_delay_s=30.0)
    fast = [make_lookup_env() for _ in range(3)]
    venv = ToolVectorEnv([slow, *fast])
    for i in range(4):
        await venv.areset_at(i, seed=i)
    slow_step = asyncio.ensure_future(venv.astep_at(0, "<lookup>1</lookup>"))
    # each fast trajectory runs a whole episode while the slow call is in flight
    for i in range(1, 4):
        task = venv.envs[i].task
        _, _, _, _, info = await venv.astep_at(i, f"<lookup>{task.metadata['key']}</lookup>")
        _, reward, terminated, _, _ = await venv.astep_at(
            i, f"<answer>{info['message']['content']}</answer>"
        )
        assert terminated and reward == 1.0
    assert not slow_step.done()
    slow_step.cancel()
    await venv.aclose()


def test_seed_list_must_match_num_envs():
    venv = vt_envs.make_vec("VT-Lookup-v0", num_envs=2)
    with pytest.raises(vt_envs.errors.InvalidConfigError, match="got 3 seeds for 2 sub-envs"):
        venv.reset(seed=[1, 2, 3])
