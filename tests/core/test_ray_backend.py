"""Sub-envs in Ray actors (``make_vec(..., backend="ray")``) behind the ToolVectorEnv API,
on a local ``ray.init(num_cpus=2)``: the same episodes as local sub-envs, the trainer's
rollout loop over them, and an actor killed mid-rollout."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import vt_envs  # noqa: E402
from vt_envs.core.tokenizer import load_tokenizer  # noqa: E402

TOK = load_tokenizer()


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _lookup_action(text: str) -> str:
    text = text.rsplit("<|im_start|>user\n", 1)[-1]  # the task's turn, not the worked examples
    value = re.findall(r"<\|im_start\|>tool\n([^<\n]+)", text)
    if value:
        return f"<answer>{value[-1].strip()}</answer>"
    key = re.findall(r"key (\d+)\?", text)[-1]
    return f"<lookup>{key}</lookup>"


def test_ray_sub_envs_play_the_same_episodes_as_local_ones():
    local = vt_envs.make_vec("VT-Lookup-v0", 4, split="test")
    remote = vt_envs.make_vec("VT-Lookup-v0", 4, backend="ray", ray_options={"actors": 2},
                              split="test")  # fmt: skip
    try:
        obs_l, _ = local.reset(seed=7)
        obs_r, _ = remote.reset(seed=7)
        for _ in range(2):
            assert all(np.array_equal(a, b) for a, b in zip(obs_l["tokens"], obs_r["tokens"]))
            actions = [_lookup_action(t) for t in obs_l["text"]]
            obs_l, rew_l, term_l, _, _ = local.step(actions)
            obs_r, rew_r, term_r, _, _ = remote.step(actions)
            assert list(rew_l) == list(rew_r) and list(term_l) == list(term_r)
        assert list(rew_r) == [1.0] * 4
    finally:
        local.close()
        remote.close()


def _responder(slow: bool):
    def respond(prompt_ids):
        text = TOK.decode(prompt_ids).rsplit("<|im_start|>user\n", 1)[-1]  # after the examples
        if "```output" in text or "<output>" in text:
            return TOK.encode("<answer>3</answer>")
        sleep = "import time; time.sleep(1.5); " if slow else ""
        return TOK.encode(f"<python>{sleep}print(1 + 2)</python>")

    return respond


def _collect(venv, n: int, slow: bool):
    from vt_envs import Task
    from vt_train.engines.base import SamplingParams
    from vt_train.engines.scripted import ScriptedEngine
    from vt_train.rollout import collect

    engine = ScriptedEngine(_responder(slow), eos_token_id=TOK.eos_token_id, tokenizer=TOK)
    tasks = [Task(f"add/{i}", "What is 1 + 2?", "3") for i in range(n)]
    return collect(engine, venv, tasks, sampling=SamplingParams(max_new_tokens=64), seed=0)


def test_the_rollout_loop_runs_over_ray_sub_envs():
    venv = vt_envs.make_vec("VT-Math-v0", 4, backend="ray", ray_options={"actors": 2},
                            split="test")  # fmt: skip
    try:
        trajectories = asyncio.run(_collect(venv, 8, slow=False))
    finally:
        venv.close()
    assert [t.reward for t in trajectories] == [1.0] * 8
    assert all(t.tool_calls == 1 for t in trajectories)


def test_an_actor_killed_mid_rollout_ends_its_trajectories_and_comes_back():
    venv = vt_envs.make_vec("VT-Math-v0", 4, backend="ray",
                            ray_options={"actors": 2, "max_restarts": 2}, split="test")  # fmt: skip
    victim = venv.ray_actors[0]
    victim_envs = set(venv.envs[0].indices)

    async def rollout_with_a_kill():
        collecting = asyncio.ensure_future(_collect(venv, 4, slow=True))
        await asyncio.sleep(0.8)  # every trajectory is inside its 1.5 s python call
        ray.kill(victim, no_restart=False)
        return await collecting

    try:
        asyncio.run(_collect(venv, 4, slow=False))  # the actors are up and warm
        trajectories = asyncio.run(rollout_with_a_kill())
        assert len(trajectories) == 4
        for t in trajectories:
            if t.metadata["env_index"] in victim_envs:
                assert t.truncated and t.metadata["truncation"] == "actor_died" and t.reward == 0
            else:
                assert t.terminated and t.reward == 1.0
        again = asyncio.run(_collect(venv, 4, slow=False))  # the actor was restarted
        assert [t.reward for t in again] == [1.0] * 4
    finally:
        venv.close()


def test_an_actor_serves_many_concurrent_sub_env_calls():
    venv = vt_envs.make_vec("VT-Lookup-v0", 64, backend="ray", ray_options={"actors": 1},
                            split="test")  # fmt: skip
    try:

        async def all_at_once():
            results = await asyncio.gather(*(venv.areset_at(i, seed=i) for i in range(64)))
            return [r[1]["task_id"] for r in results]

        assert len(asyncio.run(all_at_once())) == 64
    finally:
        venv.close()


def test_an_unknown_backend_is_refused():
    from vt_envs.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="backend"):
        vt_envs.make_vec("VT-Lookup-v0", 2, backend="dask")


def test_the_trainer_takes_env_backend_ray(tmp_path):
    import torch

    from vt_train.config import load_config
    from vt_train.trainer import Trainer

    torch.set_num_threads(1)
    config = load_config(None, [
        "algo=grpo", "env.id=VT-Lookup-v0", "env.backend=ray", "env.ray={actors: 2}",
        "rollout.engine=hf", "rollout.tasks_per_step=2", "rollout.n=2",
        "rollout.max_new_tokens=8", "steps=1", "eval_every=1", "env.eval_episodes=2",
        "optim.minibatch_size=4", "optim.micro_batch_size=4", "torch_threads=1",
        "deepspeed={zero_stage: 0, bf16: false, torch_adam: true}", f"output_dir={tmp_path}",
    ])  # fmt: skip
    trainer = Trainer(config)
    try:
        assert hasattr(trainer.train_env, "ray_actors") and trainer.train_env.num_envs == 4
        result = trainer.train(progress=False)
    finally:
        trainer.close()
    assert result["after"]["eval/mean_turns"] >= 1


def test_an_actor_that_dies_between_calls_ends_the_episode_at_the_next_step():
    venv = vt_envs.make_vec("VT-Lookup-v0", 2, backend="ray", ray_options={"actors": 1},
                            split="test")  # fmt: skip
    try:

        async def scenario():
            obs, _ = await venv.areset_at(0, seed=0)
            ray.kill(venv.ray_actors[0], no_restart=False)  # the policy is "generating"
            await asyncio.sleep(1.0)
            step = await venv.astep_at(0, _lookup_action(obs["text"]))
            again, _ = await venv.areset_at(0, seed=1)  # the restarted actor serves it
            return step, again

        (obs, reward, terminated, truncated, info), again = asyncio.run(scenario())
        assert truncated and info["truncation"] == "actor_died" and info["actor_sub_envs"] == [0, 1]
        assert len(again["tokens"]) > 0
    finally:
        venv.close()
