"""Trainer behaviours beyond the update itself: truncation, dynamic sampling,
importance correction, tokenizers, weight-sync checks, step numbers, resume."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from train_helpers import TRAINER_OVERRIDES, ScriptedLookupPolicy

from vt_envs.core.loop import run_sync
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.domains.lookup import make_lookup_env
from vt_envs.errors import InvalidConfigError
from vt_envs.vector import ToolVectorEnv
from vt_train.algorithms import AlgorithmConfig
from vt_train.algorithms.shaping import overlong_penalty, shaping_metrics
from vt_train.config import load_config
from vt_train.engines import ScriptedEngine, WeightSyncError
from vt_train.rollout import collect
from vt_train.trainer import Trainer, _rollout_is_weights, check_same_tokenizer, sync_tolerances

TOK = load_tokenizer()


def make_trainer(tmp_path, *extra, responder=None) -> Trainer:
    config = load_config(None, [*TRAINER_OVERRIDES, f"output_dir={tmp_path}", *extra])
    trainer = Trainer(config)
    trainer.engine = ScriptedEngine(
        responder or ScriptedLookupPolicy(), eos_token_id=TOK.eos_token_id, tokenizer=TOK
    )
    return trainer


# -- truncation -----------------------------------------------------------------------


def test_a_context_truncation_ends_the_episode_through_the_env():
    env = make_lookup_env(rewards={"missing_answer_penalty": 1.0}, max_turns=8)
    venv = ToolVectorEnv([env])
    filler = ScriptedEngine([TOK.encode(" hmm" * 40)], eos_token_id=TOK.eos_token_id)
    prompt_length = len(env.reset(seed=0)[0]["tokens"])
    (trajectory,) = run_sync(
        collect(filler, venv, ["lookup/train/0"], max_context=prompt_length + 30),
        method="collect",
        async_method="collect",
    )
    assert trajectory.truncated and trajectory.metadata["truncation"] == "max_context"
    # the env's own end-of-episode accounting ran: the penalty, reward_parts, closed sessions
    assert trajectory.reward == -1.0
    assert trajectory.reward_parts == {"outcome": 0.0, "missing_answer": -1.0}
    assert env._live.sessions == {} and env._episode.done
    venv.close()


def _truncated_pair():
    def trajectory(truncated):
        from vt_train.trajectory import Trajectory

        return Trajectory(
            "t", 0, [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], 1, reward=0.5, truncated=truncated
        )

    return [trajectory(True), trajectory(False)]


@pytest.mark.parametrize(
    ("mode", "rewards", "masks"),
    [
        ("keep", [0.5, 0.5], [[0, 1, 1], [0, 1, 1]]),
        ("mask", [0.5, 0.5], [[0, 0, 0], [0, 1, 1]]),
        ("penalty", [-0.25, 0.5], [[0, 1, 1], [0, 1, 1]]),
    ],
)
def test_truncated_samples_are_kept_masked_or_penalized(tmp_path, mode, rewards, masks):
    trainer = make_trainer(tmp_path, f"rollout.truncated={mode}", "rollout.truncation_penalty=0.75")
    pair = _truncated_pair()
    trainer._shape(pair)
    trainer._shape(pair)  # once per trajectory
    assert shaping_metrics(pair)["rollout/truncated_share"] == 0.5
    assert [t.reward for t in pair] == rewards and [t.loss_mask for t in pair] == masks
    trainer.close()


# -- dynamic sampling ---------------------------------------------------------------


class WrongThenMixed(ScriptedLookupPolicy):
    """Guesses wrong for the first ``wrong`` first turns, then alternates as the parent."""

    def __init__(self, wrong: int):
        super().__init__()
        self.wrong = wrong
        self.first_turns = 0

    def __call__(self, prompt):
        text = self.tok.decode(prompt)
        if not text.rsplit("<|im_start|>", 2)[-2].startswith("tool\n"):
            self.first_turns += 1
            if self.first_turns <= self.wrong:
                return self.tok.encode("<answer>000</answer>")
        return super().__call__(prompt)


def test_dapo_plays_more_rounds_until_the_step_is_full(tmp_path):
    trainer = make_trainer(tmp_path, "algo=dapo", responder=WrongThenMixed(wrong=8))
    metrics = trainer.step()  # round 1: 8 wrong answers, all-equal groups; round 2 differs
    assert metrics["rollout/sampling_rounds"] == 2.0
    assert "policy/pg_loss" in metrics
    # Rollout metrics cover both rounds (the policy as it played), not the kept groups.
    assert metrics["rollout/all_equal_group_share"] == 0.5
    assert metrics["rollout/trained_share"] == 0.5
    assert metrics["rollout/accuracy"] == 0.25  # round 2's groups are half right
    assert metrics["kept/accuracy"] == 0.5  # and only they train
    trainer.close()


class RightButSomeLonger(ScriptedLookupPolicy):
    """Always looks the key up and answers right; every other lookup is longer."""

    def __call__(self, prompt):
        text = self.tok.decode(prompt)
        if text.rsplit("<|im_start|>", 2)[-2].startswith("tool\n"):
            return super().__call__(prompt)
        self.calls += 1
        key = text.rsplit("key ", 1)[1].split("?")[0]
        return self.tok.encode(f"{' ok' * 4 if self.calls % 2 else ''}<lookup>{key}</lookup>")


def test_the_overlong_punishment_is_dapos_ramp():
    ramp = dict(max_tokens=100, buffer=20, factor=1.0)
    assert [overlong_penalty(n, **ramp) for n in (10, 80, 90, 100, 150)] == [0, 0, -0.5, -1, -1]
    assert overlong_penalty(90, max_tokens=100, buffer=20, factor=0.5) == -0.25
    dapo = load_config(None, ["algo=dapo", "rollout.max_context=2048"]).algorithm_config()
    assert (dapo.overlong_shaping, dapo.overlong_max_tokens, dapo.overlong_buffer) == (
        True, 2048, 409,
    )  # fmt: skip
    with pytest.raises(InvalidConfigError, match="overlong_max_tokens"):
        AlgorithmConfig.from_preset("dapo")


def test_dynamic_sampling_filters_on_rewards_after_the_overlong_punishment(tmp_path):
    """Every answer is right, half of them 18 generated tokens long instead of 10. With
    the punishment (20 tokens, a 10-token ramp) the long ones score 0.2, so every group
    differs and trains; filtered before shaping, every group would look all-equal."""
    responder = RightButSomeLonger()
    shaping = "algorithm={overlong_max_tokens: 20, overlong_buffer: 10}"
    shaped = make_trainer(tmp_path / "a", "algo=dapo", shaping, responder=responder)
    metrics = shaped.step()
    assert metrics["rollout/trained_share"] == 1.0 and "policy/pg_loss" in metrics
    assert metrics["rollout/overlong_share"] == 0.5
    assert metrics["rollout/overlong_penalty_mean"] == pytest.approx(-0.4)
    shaped.close()
    plain = make_trainer(
        tmp_path / "b", "algo=dapo", "algorithm={overlong_shaping: false}",
        responder=RightButSomeLonger(),
    )  # fmt: skip
    metrics = plain.step()
    assert metrics["rollout/trained_share"] == 0.0 and "policy/pg_loss" not in metrics
    plain.close()


# -- importance correction -----------------------------------------------------------


def test_truncated_importance_weights():
    gap = torch.tensor([[0.0, 0.1, 2.0], [0.0, -0.5, 0.2]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]], dtype=torch.float32)
    off, metrics = _rollout_is_weights(gap, mask, AlgorithmConfig())
    assert off is None and metrics["rollout/is_token_clip_frac"] == pytest.approx(0.25)
    token, _ = _rollout_is_weights(gap, mask, AlgorithmConfig(rollout_is="token"))
    expected = [[0.0, np.exp(0.1), 2.0], [0.0, np.exp(-0.5), np.exp(0.2)]]  # cap 2
    assert token.flatten().tolist() == pytest.approx(np.ravel(expected), rel=1e-6)
    seq, _ = _rollout_is_weights(gap, mask, AlgorithmConfig(rollout_is="sequence"))
    expected = [[0.0, 2.0, 2.0], [0.0, np.exp(-0.3), np.exp(-0.3)]]  # exp(2.1) capped
    assert seq.flatten().tolist() == pytest.approx(np.ravel(expected), rel=1e-6)


def test_importance_weights_scale_the_loss(tmp_path):
    from vt_train.batch import TrainBatch

    scorer = make_trainer(tmp_path / "r")
    played = scorer.rollout()
    batch = TrainBatch.from_trajectories(played, pad_token_id=TOK.pad_token_id)
    old = scorer._prepare(batch)[0].extras["old_logprobs"]
    for t, row in zip(played, old):  # the engine sampled 0.5 nats below the trainer's policy
        n = len(t.input_ids)
        t.rollout_logprobs = [lp - 0.5 * m for lp, m in zip(row[:n].tolist(), t.loss_mask)]
    scorer.close()
    one_update = "optim.minibatch_size=8"  # the gradient is then taken before any update
    plain = make_trainer(tmp_path / "a", one_update).learn(copy.deepcopy(played))
    weighted = make_trainer(tmp_path / "b", one_update, "algorithm.rollout_is=token").learn(played)
    assert plain["rollout/is_token_weight_mean"] == pytest.approx(np.exp(0.5), rel=1e-4)
    assert weighted["rollout/is_token_clip_frac"] == 0.0  # e^0.5 < cap 2
    # each token's loss is scaled by e^0.5, so the gradient is too (the GRPO loss itself is 0
    # before the first update: group-normalized advantages sum to zero)
    want = np.exp(0.5) * plain["policy/grad_norm"]
    assert weighted["policy/grad_norm"] == pytest.approx(want, rel=1e-4)


# -- memory options ------------------------------------------------------------------


def _record_gradients(trainer) -> list[list[torch.Tensor]]:
    """Each optimizer step's gradients (ZeRO-0 keeps them on the parameters)."""
    steps, step = [], trainer.actor.step

    def recording(update):
        steps.append([p.grad.clone() for p in trainer.actor.module.parameters()])
        return step(update)

    trainer.actor.step = recording
    return steps


@pytest.mark.parametrize(
    "option", ["optim.gradient_checkpointing=true", "optim.logprob_chunk_size=3"]
)
def test_memory_options_leave_the_update_unchanged(tmp_path, option, monkeypatch):
    from vt_train import prefix

    monkeypatch.setattr(prefix, "MIN_PREFIX", 10**9)  # one decoder pass per micro-batch
    played = make_trainer(tmp_path / "r").rollout()
    plain = make_trainer(tmp_path / "a")
    saving = make_trainer(tmp_path / "b", option)
    layer = saving.actor.module.lm.model.layers[0]
    forwards = []
    layer.register_forward_pre_hook(lambda *_: forwards.append(1))
    grads_a, grads_b = _record_gradients(plain), _record_gradients(saving)
    a, b = plain.learn(copy.deepcopy(played)), saving.learn(played)
    assert b["policy/grad_norm"] == pytest.approx(a["policy/grad_norm"], rel=1e-4)
    # The first step's gradients, where both start from the same weights. (Weights after
    # Adam are no measure: it scales a near-zero component's float noise, which summing
    # chunks in another order makes, into a step of up to lr.)
    for g, h in zip(grads_a[0], grads_b[0], strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)
    # old logprobs: 4 micro-batches; each update: 2 + 2 micro-batches, and checkpointing
    # runs every layer again in the backward
    assert len(forwards) == (4 + 8 if "checkpointing" in option else 4 + 4)
    plain.close(), saving.close()


def test_the_shared_prefix_forward_gives_the_plain_update(tmp_path, monkeypatch):
    """Trainer.learn through the shared-prefix path (the Lookup rows share their system
    prompt) and through the plain one: the same old logprobs, gradient and weights."""
    from vt_train import prefix

    played = make_trainer(tmp_path / "r").rollout()
    calls = []
    real = prefix.shared_prefix_length
    monkeypatch.setattr(
        prefix, "shared_prefix_length", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1]
    )
    fast = make_trainer(tmp_path / "a")
    b = fast.learn(copy.deepcopy(played))
    assert calls and min(calls) >= prefix.MIN_PREFIX  # every micro-batch ran its prefix once
    monkeypatch.setattr(prefix, "MIN_PREFIX", 10**9)
    plain = make_trainer(tmp_path / "b")
    a = plain.learn(played)
    assert b["policy/grad_norm"] == pytest.approx(a["policy/grad_norm"], rel=1e-4)
    for p, q in zip(plain.actor.module.parameters(), fast.actor.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    plain.close(), fast.close()


# -- tokenizers -------------------------------------------------------------------------


def _other_tokenizer(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
    from test_tokenizer import _small_chatml_dir

    return load_tokenizer(_small_chatml_dir(tmp_path / "other"))


def test_mismatched_tokenizers_are_named(tmp_path):
    other = _other_tokenizer(tmp_path)
    check_same_tokenizer([("trainer", TOK), ("env", TOK), ("rollout engine", None)])
    with pytest.raises(InvalidConfigError, match=r"the env tokenizer .* differs from the trainer"):
        check_same_tokenizer([("trainer", TOK), ("env", other)])


def test_the_vllm_weights_carry_the_policys_own_tokenizer(tmp_path):
    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    other = _other_tokenizer(tmp_path)
    model_dir = tmp_path / "policy"
    save_pretrained_with_tokenizer(
        build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                         num_kv_heads=1, intermediate_size=64), other),
        other,
        model_dir,
    )  # fmt: skip
    trainer = make_trainer(tmp_path / "run", f"init_from={model_dir}", "env.eval_episodes=2")
    trainer.config.rollout.engine = "vllm"  # only the weights directory is built here
    kwargs = trainer._engine_kwargs(trainer.actor.module.lm, "cpu")
    written = load_tokenizer(kwargs["model_path"])
    assert written.vocab_size == other.vocab_size != TOK.vocab_size
    assert written.encode("the cat sat") == other.encode("the cat sat")
    trainer.close()


# -- weight-sync check ---------------------------------------------------------------


def test_sync_tolerances_follow_the_dtype():
    fp32 = load_config(None, ["deepspeed.bf16=false"])
    bf16 = load_config(None, ["deepspeed.bf16=true"])
    assert sync_tolerances(fp32) == (1e-3, 5e-2)
    assert sync_tolerances(bf16) == (0.1, 2.0)  # ~0.1 per token is normal for bf16
    assert sync_tolerances(load_config(None, ["rollout.sync_mean_tol=0.3"]))[0] == 0.3


def _synced_hf_engine(trainer):
    from vt_train.engines import make_engine

    return make_engine("hf", model=copy.deepcopy(trainer.actor.module.lm), tokenizer=TOK)


def test_a_stale_engine_fails_the_sync_check_with_the_numbers(tmp_path):
    trainer = make_trainer(tmp_path, "rollout.engine=hf", "rollout.sync_check=true")
    played = trainer.rollout()
    trainer.engine = _synced_hf_engine(trainer)
    trainer.engine.update_weights = lambda weights: None  # a sync that silently does nothing
    with pytest.raises(WeightSyncError, match=r"mean \|diff\| .* > 0.001"):
        trainer.learn(played)
    trainer.close()


def test_a_skipped_sync_is_caught_in_bf16_where_the_tolerance_cannot_see_it(tmp_path):
    trainer = make_trainer(
        tmp_path, "rollout.engine=hf", "rollout.sync_check=true", "deepspeed.bf16=true"
    )
    played = trainer.rollout()
    trainer.engine = _synced_hf_engine(trainer)
    synced = trainer.learn(played)  # a real sync: the engine moved with the trainer
    assert synced["sync/checked"] == 1.0
    assert synced["sync/error"] < 0.5 * synced["sync/shift"]
    trainer.engine.update_weights = lambda weights: None  # the next sync is skipped
    with pytest.raises(WeightSyncError, match="did not take the update") as err:
        trainer.learn(played)
    # the engine is stale, yet within bf16's agreement tolerance: only the shift check saw it
    assert "mean |diff|" not in str(err.value)
    trainer.close()


# -- bookkeeping ------------------------------------------------------------------------


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_returned_step_is_the_logged_step(tmp_path):
    trainer = make_trainer(tmp_path)
    metrics = trainer.step()
    assert metrics["step"] == 1 == _records(tmp_path)[-1]["step"]
    trainer.close()


def test_resume_does_not_duplicate_metrics(tmp_path):
    first = make_trainer(tmp_path)
    first.step()
    first.step()
    first.save_checkpoint()
    first.step()  # logged, then the run "dies"
    first.close()
    assert [r["step"] for r in _records(tmp_path)] == [1, 2, 3]
    resumed = make_trainer(tmp_path)  # vt-train resume: the same run directory
    resumed.load_checkpoint()
    resumed.step()
    resumed.close()
    assert [r["step"] for r in _records(tmp_path)] == [1, 2, 3]


def test_the_trainer_generates_only_the_tasks_it_draws(tmp_path):
    trainer = make_trainer(tmp_path)  # VT-SQL's 30k generated tasks once took 3 min here
    train_tasks, eval_tasks = trainer.train_tasks, trainer.eval_env.envs[0].unwrapped.tasks
    assert len(train_tasks._cache) == 0 and len(eval_tasks._cache) == 4  # env.eval_episodes
    trainer.step()
    assert 0 < len(train_tasks._cache) <= 2 < len(train_tasks)  # rollout.tasks_per_step
    trainer.close()


def test_dynamic_sampling_that_keeps_nothing_trains_nothing_and_says_so(tmp_path):
    trainer = make_trainer(
        tmp_path, "algo=dapo", "rollout.max_sampling_rounds=1", responder=WrongThenMixed(wrong=8)
    )
    metrics = trainer.step()  # one round, every group all wrong
    assert metrics["rollout/all_equal_group_share"] == 1.0
    assert metrics["rollout/trained_share"] == 0.0 and "policy/pg_loss" not in metrics
    trainer.close()
