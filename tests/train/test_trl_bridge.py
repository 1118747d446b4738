"""VT envs in TRL (vt_train.integrations.trl): one step of TRL's own GRPOTrainer on
VT-Lookup-v0, with VT's token ids and the env's reward (CPU, tiny model)."""

from __future__ import annotations

import math
import os
import time
from collections import Counter

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

import datasets
from train_helpers import saved_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from vt_train.integrations.trl import VTRollout, env_reward, trajectories_to_trl
from vt_train.trajectory import Trajectory

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

#: Episodes short and cheap; every invalid action costs 0.25, so the env's reward is one
#: no other reward source could produce (the untrained policy writes no valid action).
ENV_KWARGS = {"max_turns": 2, "rewards": {"invalid_action_penalty": 0.25}}


def completion_bonus(completion_ids, **_):
    """A second reward (0.01 per completion id) so that advantages, hence the loss, are
    not all zero: the env's reward is the same for every episode of an untrained policy."""
    return [0.01 * len(ids) for ids in completion_ids]


def grpo_step(
    model, tokenizer, out_dir, *, max_new_tokens: int = 8, mode: str = "sync", id_prompts=False
):
    """Run one GRPOTrainer step (2 prompts x 2 generations) on VT-Lookup-v0; return the
    trainer, the rollout, what TRL generated and scored, and the loss inputs it trained on.
    ``id_prompts``: the dataset's prompts are task ids, not the env's prompt messages."""
    rollout = VTRollout(
        "VT-Lookup-v0", env_kwargs=ENV_KWARGS, max_new_tokens=max_new_tokens, mode=mode
    )
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=max_new_tokens,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[env_reward, completion_bonus],
        args=args,
        train_dataset=(
            datasets.Dataset.from_dict({"prompt": ["lookup/train/0", "lookup/train/1"]})
            if id_prompts
            else rollout.dataset(2)
        ),
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    scored, trained = [], []
    generate_and_score, compute_loss = (
        trainer._generate_and_score_completions,
        trainer._compute_loss,
    )

    def spy_scored(inputs):
        out = generate_and_score(inputs)
        scored.append(out)
        return out

    def spy_trained(model, inputs):
        trained.append(inputs)
        return compute_loss(model, inputs)

    trainer._generate_and_score_completions = spy_scored
    trainer._compute_loss = spy_trained
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    changed = any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())
    return trainer, rollout, scored, trained, changed


def unpad(ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    return ids[mask.bool()].tolist()


def check_step(trainer, rollout, scored, trained, changed, *, untrained=True) -> list[Trajectory]:
    # The step ran, with a finite loss, and moved the weights.
    assert trainer.state.global_step == 1
    logs = trainer.state.log_history[0]
    assert math.isfinite(logs["loss"])
    assert changed

    # One episode per prompt TRL asked for: 2 tasks x 2 generations, grouped.
    trajectories = rollout.last_trajectories
    assert len(trajectories) == 4 and rollout.calls == 1
    assert [t.task_id for t in trajectories] == ["lookup/train/0"] * 2 + ["lookup/train/1"] * 2

    # The env's reward reached TRL, unchanged: it is what TRL logged for env_reward.
    rewards = [t.reward for t in trajectories]
    if untrained:  # the env's invalid-action penalties (a tiny random policy writes no action)
        assert all(r < 0 for r in rewards)
    assert logs["rewards/env_reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
    bonus = [0.01 * (len(t.input_ids) - t.prompt_length) for t in trajectories]
    assert logs["rewards/completion_bonus/mean"] == pytest.approx(sum(bonus) / len(bonus))
    assert logs["reward"] == pytest.approx(sum(map(sum, zip(rewards, bonus))) / len(rewards))

    # TRL's tensors hold VT's ids exactly: the prompt is the env's reset observation, the
    # completion the episode's actions and observations, in the prompts' order.
    (out,) = scored
    for i, t in enumerate(trajectories):
        assert unpad(out["prompt_ids"][i], out["prompt_mask"][i]) == t.input_ids[: t.prompt_length]
        completion = unpad(out["completion_ids"][i], out["completion_mask"][i])
        assert completion == t.input_ids[t.prompt_length :]
        # Env-written ids are out of the loss (TRL's tool_mask), the policy's in.
        tool_mask = unpad(out["tool_mask"][i], out["completion_mask"][i])
        assert tool_mask == t.loss_mask[t.prompt_length :]
    assert any(0 in t.loss_mask[t.prompt_length :] for t in trajectories)  # observations
    loss_tokens = sum(sum(t.loss_mask[t.prompt_length :]) for t in trajectories)
    assert int(out["num_items_in_batch"]) == loss_tokens

    # ... and the batch the loss was computed on (TRL shuffles it) is the same episodes.
    (inputs,) = trained
    trained_rows = Counter(
        tuple(unpad(inputs["completion_ids"][i], inputs["completion_mask"][i]))
        for i in range(inputs["completion_ids"].shape[0])
    )
    assert trained_rows == Counter(tuple(t.input_ids[t.prompt_length :]) for t in trajectories)
    return trajectories


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_one_grpo_step_on_vt_lookup_with_the_tiny_model(tmp_path, mode):
    path = saved_tiny_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # (async: the dataset's prompts are task ids)
    step = grpo_step(model, tokenizer, tmp_path / "out", mode=mode, id_prompts=mode == "async")
    trainer, rollout, *_ = step
    try:
        check_step(*step)
        # Every turn of the 4 episodes was generated, in batches, by the trainer's model.
        turns = sum(t.turns for t in rollout.last_trajectories)
        assert sum(rollout._engine.batch_sizes) == turns
    finally:
        rollout.close()


@pytest.mark.slow
def test_one_grpo_step_on_vt_lookup_with_smollm2(tmp_path):
    from vt_envs.core.packaged_models import resolve_model

    try:
        path = resolve_model("smollm2-135m-instruct", dtype="float32")
    except Exception as exc:  # the package (or gguf) is not installed
        pytest.skip(f"smollm2-135m-instruct is not available: {exc}")
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    start = time.perf_counter()
    step = grpo_step(model, tokenizer, tmp_path / "out", max_new_tokens=16)
    try:
        trajectories = check_step(*step, untrained=False)
    finally:
        step[1].close()
    # The env used the model's own tokenizer: VT's ids decode to SmolLM2's chat template.
    assert tokenizer.decode(trajectories[0].input_ids).startswith("<|im_start|>system")
    print(f"SmolLM2 GRPO step: {time.perf_counter() - start:.1f} s")


def test_trajectories_to_trl_keeps_ids_and_masks_the_env():
    t = Trajectory(
        task_id="t/0",
        group_id=0,
        input_ids=[1, 2, 3, 10, 11, 20, 21, 12],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1],
        rollout_logprobs=[0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3],
        prompt_length=3,
        reward=0.75,
        reward_parts={"outcome": 1.0, "invalid_action": -0.25},
    )
    empty = Trajectory("t/1", 0, [1, 2, 3], [0, 0, 0], [0.0] * 3, prompt_length=3)
    out = trajectories_to_trl([t, empty], eos_token_id=99)
    assert out["prompt_ids"] == [[1, 2, 3], [1, 2, 3]]
    assert out["completion_ids"] == [[10, 11, 20, 21, 12], [99]]
    assert out["env_mask"] == [[1, 1, 0, 0, 1], [0]]
    assert out["logprobs"][0] == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert out["env_reward"] == [0.75, 0.0]
    assert out["vt_task_id"] == ["t/0", "t/1"]
    assert env_reward(env_reward=out["env_reward"], prompts=None) == [0.75, 0.0]
