"""PPO's critic: values aligned as V(s_t), and bandits PPO can only learn through it.

The value of token ``t`` must be the critic's output *before* it sees token
``t`` (position ``t - 1``). The bandits below reward a known set of actions
(even token ids); PPO with a critic learns them only if the critic's value
is the baseline of the state the action was taken in. With the value after
the action, a fitted critic predicts the reward itself and the advantage
vanishes.
"""

from __future__ import annotations

import pytest
import torch
from train_helpers import TRAINER_OVERRIDES

from vt_envs.core.loop import run_sync
from vt_envs.core.tokenizer import load_tokenizer
from vt_train.config import load_config
from vt_train.engines.base import SamplingParams
from vt_train.model import state_values
from vt_train.trainer import Trainer
from vt_train.trajectory import Trajectory

TOK = load_tokenizer()
PROMPT = TOK.encode("<|im_start|>user\nPick.<|im_end|>\n<|im_start|>assistant\n")
OBSERVATION = TOK.encode("<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n")
ARM_A, ARM_B = TOK.encode("A")[0], TOK.encode("B")[0]


class StubCritic:
    """Raw outputs ``out[b, t] = reward_b`` at and after the action (it has seen it),
    0.5 before: a critic that has fitted the one-token bandit perfectly."""

    def __init__(self, action_at: int, rewards: torch.Tensor):
        self.action_at, self.rewards = action_at, rewards

    def __call__(self, input_ids, attention_mask=None):
        out = torch.full(input_ids.shape, 0.5)
        out[:, self.action_at :] = self.rewards[:, None]
        return out

    def eval(self):
        return self


def test_state_values_shift_by_one_position():
    critic = lambda ids, mask=None: torch.arange(ids.numel(), dtype=torch.float32).view(ids.shape)  # noqa: E731
    values = state_values(critic, torch.zeros(2, 4, dtype=torch.long))
    assert values.tolist() == [[0.0, 0.0, 1.0, 2.0], [0.0, 4.0, 5.0, 6.0]]


def _trainer(tmp_path, *extra: str) -> Trainer:
    overrides = [
        *TRAINER_OVERRIDES,
        f"output_dir={tmp_path}",
        "algo=ppo",
        "rollout.engine=hf",
        "rollout.sync_check=true",
        "algorithm={whiten_advantages: false, value_clip: null}",
        *extra,
    ]
    return Trainer(load_config(None, overrides))


def _one_token(reward_action: list[int], rewards: list[float]) -> list[Trajectory]:
    return [
        Trajectory(
            task_id="bandit",
            group_id=0,
            input_ids=[*PROMPT, a],
            loss_mask=[0] * len(PROMPT) + [1],
            rollout_logprobs=[0.0] * (len(PROMPT) + 1),
            prompt_length=len(PROMPT),
            reward=r,
            terminated=True,
        )
        for a, r in zip(reward_action, rewards)
    ]


def test_a_fitted_critic_gives_the_action_its_advantage(tmp_path):
    # Hand-computed: V(s) = 0.5 for the state before the action, rewards [1, 0]:
    # the action token's advantage is r - V(s) = [0.5, -0.5], not [0, 0].
    trainer = _trainer(tmp_path)
    trajectories = _one_token([TOK.encode("a")[0], TOK.encode("b")[0]], [1.0, 0.0])
    from vt_train.batch import TrainBatch

    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=TOK.pad_token_id)
    trainer.critic = StubCritic(len(PROMPT), batch.rewards)
    prepared, _ = trainer._prepare(batch)
    action = len(PROMPT)
    assert prepared.extras["advantages"][:, action].tolist() == pytest.approx([0.5, -0.5])
    assert prepared.extras["old_values"][:, action].tolist() == pytest.approx([0.5, 0.5])
    trainer.close()


@pytest.fixture(scope="module")
def two_armed_policy(tmp_path_factory) -> str:
    """A tiny policy warmed up to pick A or B after the prompt, half the time each."""
    from train_helpers import SMALL_MODEL

    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    model = build_tiny_model(TinyModelConfig(**SMALL_MODEL)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.tensor([[*PROMPT, ARM_A], [*PROMPT, ARM_B]])
    for _ in range(150):  # max of log p(A) + log p(B): p(A) = p(B) = 1/2
        logits = model(input_ids=ids).logits[:, -2].float()
        loss = -torch.log_softmax(logits, -1)[[0, 1], [ARM_A, ARM_B]].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("two_armed") / "policy"
    save_pretrained_with_tokenizer(model.eval(), None, path)
    return str(path)


def test_a_fitted_critic_across_an_observation_gap(tmp_path):
    # Two turns: action 1, an observation, action 2; the reward depends on action 1.
    # The fitted critic knows the reward once it has seen action 1; before it, 0.5.
    # GAE (gamma = lam = 1) gives action 1 the advantage r - V(s_1) = +-0.5, and
    # action 2 (taken when the reward is already decided) r - V(s_2) = 0.
    trainer = _trainer(tmp_path)
    first = len(PROMPT)
    second = first + 1 + len(OBSERVATION)
    trajectories = [
        Trajectory(
            "bandit", 0, [*PROMPT, arm, *OBSERVATION, arm],
            [0] * first + [1] + [0] * len(OBSERVATION) + [1],
            [0.0] * (second + 1), first, reward=reward, terminated=True,
        )
        for arm, reward in ((ARM_A, 1.0), (ARM_B, 0.0))
    ]  # fmt: skip
    from vt_train.batch import TrainBatch

    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=TOK.pad_token_id)
    trainer.critic = StubCritic(first, batch.rewards)
    prepared, _ = trainer._prepare(batch)
    advantages = prepared.extras["advantages"]
    assert advantages[:, first].tolist() == pytest.approx([0.5, -0.5])
    assert advantages[:, second].tolist() == pytest.approx([0.0, 0.0])
    trainer.close()


def _p_arm_a(trainer: Trainer) -> float:
    with torch.no_grad():
        logits = trainer.actor.module.lm(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    return float(torch.softmax(logits.float(), -1)[ARM_A])


def _sample(trainer: Trainer, prefix: list[int], n: int, seed: int) -> list[tuple[int, float]]:
    async def draw():
        import asyncio

        params = [
            SamplingParams(max_new_tokens=1, temperature=1.0, seed=seed * 1000 + i)
            for i in range(n)
        ]
        gens = await asyncio.gather(*(trainer.engine.generate(prefix, p) for p in params))
        return [(g.token_ids[0], g.logprobs[0]) for g in gens]

    return run_sync(draw(), method="sample", async_method="draw")


def _bandit_run(
    trainer: Trainer, *, turns: int, warmup: int, steps: int, n: int = 32
) -> tuple[float, float]:
    """Train on a bandit that rewards arm A as the first action; P(A) before and after.

    For the first ``warmup`` steps only the critic learns (the actor's learning
    rate is ~0), so the policy then learns against a fitted critic: from the
    advantage the critic's baseline leaves, and from nothing else.
    """
    start = _p_arm_a(trainer)
    base_lr = trainer.actor.base_lr
    for step in range(warmup + steps):
        trainer.actor.base_lr = 1e-12 if step < warmup else base_lr
        trajectories = []
        for i, (token, logprob) in enumerate(_sample(trainer, PROMPT, n, seed=step)):
            ids, mask = [*PROMPT, token], [0] * len(PROMPT) + [1]
            lps = [0.0] * len(PROMPT) + [logprob]
            if turns == 2:  # an observation, then a second action that earns nothing itself
                ids += OBSERVATION
                mask += [0] * len(OBSERVATION)
                lps += [0.0] * len(OBSERVATION)
                ((second, second_lp),) = _sample(trainer, ids, 1, seed=10_000 + step * n + i)
                ids, mask, lps = [*ids, second], [*mask, 1], [*lps, second_lp]
            reward = float(token == ARM_A)
            trajectories.append(
                Trajectory("bandit", 0, ids, mask, lps, len(PROMPT), reward=reward, terminated=True)
            )
        trainer.learn(trajectories)
    return start, _p_arm_a(trainer)


BANDIT = [
    "rollout.tasks_per_step=4",
    "rollout.n=8",
    "optim.minibatch_size=32",
    "optim.micro_batch_size=16",
    "optim.epochs=2",
    "optim.lr=3e-3",
    "optim.critic_lr=1e-1",
]


@pytest.mark.parametrize("turns", [1, 2])
def test_ppo_with_its_critic_learns_the_rewarded_action(tmp_path, two_armed_policy, turns):
    trainer = _trainer(tmp_path, *BANDIT, f"init_from={two_armed_policy}")
    start, end = _bandit_run(trainer, turns=turns, warmup=30, steps=10)
    trainer.close()
    assert 0.35 < start < 0.65
    assert end > 0.9, f"P(rewarded arm) went from {start:.2f} to {end:.2f}"
