"""SFT warm-up on oracle trajectories, and a greedy/sampled evaluator.

RL from a random tiny model never sees a reward, so the quickstart first
imitates the env's oracle. Trajectories are produced *through the env*,
token-in / token-out: the oracle acts in text, each action is tokenized once
(``tokenizer.encode(action)``, loss 1), and the env's observation ids are
appended as they come (loss 0). Stop tags (``</lookup>``, ``</answer>``) end
each action and are trained on: the policy learns to emit the tag and stop;
the env inserts the turn boundary itself.

``SFTConfig.mix`` mixes in a *guessing* policy that answers at once without a
tool call. The warmed-up policy then calls the tool only part of the time,
which leaves RL a decision to learn (when to call the tool), not only
precision.
"""

from __future__ import annotations

import importlib
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import vt_envs
from vt_envs.core.policy import Policy
from vt_envs.core.task import Task
from vt_envs.errors import InvalidConfigError
from vt_train.model import TinyModelConfig
from vt_train.prefix import decoder_hidden, first_selected
from vt_train.progress import progress_bar

__all__ = [
    "GuessPolicy",
    "SFTConfig",
    "SFTExample",
    "SFTRunConfig",
    "collate",
    "collect_sft_examples",
    "evaluate",
    "mix_phase_config",
    "run_sft",
    "run_sft_command",
    "sft_loss",
]


@dataclass
class SFTConfig:
    """SFT warm-up settings.

    Attributes:
        env_id: the env whose oracle is imitated.
        env_kwargs: passed to ``vt_envs.make`` (e.g. ``num_keys``).
        teacher: the demonstrating policy, ``"module:Class"`` (built with no
            arguments); ``None``: the env's registered oracle.
        split: task split the trajectories come from (never the test split).
        num_trajectories: distinct episodes collected before training.
        mix: fraction of those episodes played by :class:`GuessPolicy`
            (answer at once, no tool) instead of the oracle.
        steps: optimizer steps.
        batch_size: episodes per step (sampled with replacement, seeded).
        lr: peak AdamW learning rate (linear warm-up, cosine decay to 10%).
        warmup_steps: linear warm-up length.
        weight_decay: AdamW weight decay.
        grad_clip: max global gradient norm (``0``: off).
        seed: seeds episode order, the guess policy and batch sampling.
        log_every: record the loss every this many steps.
    """

    env_id: str = "VT-Lookup-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    teacher: str | None = None
    split: str = "train"
    num_trajectories: int = 2000
    mix: float = 0.0
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10

    def __post_init__(self) -> None:
        if not 0.0 <= self.mix <= 1.0:
            raise InvalidConfigError(f"SFTConfig.mix is a fraction in [0, 1], got {self.mix}")
        if self.split == "test":
            raise InvalidConfigError(
                "SFTConfig.split='test' would train on the held-out tasks; use 'train'"
            )
        for name in ("num_trajectories", "steps", "batch_size"):
            if getattr(self, name) < 1:
                value = getattr(self, name)
                raise InvalidConfigError(f"SFTConfig.{name} must be >= 1, got {value}")
        if self.lr <= 0:
            raise InvalidConfigError(f"SFTConfig.lr must be > 0, got {self.lr}")
        if self.teacher is not None and ":" not in self.teacher:
            raise InvalidConfigError(
                f"SFTConfig.teacher is an import path 'module:Class', got {self.teacher!r} "
                "(e.g. 'vt_envs.domains.math.oracle:MathCodePolicy')"
            )


@dataclass
class SFTExample:
    """One tokenized episode: ``input_ids`` with ``loss_mask`` 1 on action tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    reward: float
    used_tool: bool


class GuessPolicy(Policy):
    """Answers at once, without a tool: random digits as long as the gold answer.

    It gives the SFT mixture trajectories in which the model does not call
    the tool; on VT-Lookup-v0 such a guess is right with probability
    ``10 ** -value_digits``. (The gold's *length* is the only privileged fact
    it uses.)
    """

    def __init__(self, rng: random.Random, answer_tag: str = "answer"):
        self.rng = rng
        self.answer_tag = answer_tag

    def reset(self, task: Task) -> None:
        self.length = max(1, len(str(task.gold)))

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        digits = "".join(self.rng.choice("0123456789") for _ in range(self.length))
        return f"<{self.answer_tag}>{digits}</{self.answer_tag}>"


def _play(env: Any, policy: Policy, task: Task) -> SFTExample:
    """Run ``policy`` on ``task`` and tokenize the episode token-in / token-out."""
    tokenizer = env.tokenizer
    obs, info = env.reset(options={"task": task})
    policy.reset(env.task)
    ids = obs["tokens"].tolist()
    mask = [0] * len(ids)
    used_tool = False
    while True:
        action = policy.act(obs["text"], info)
        action_ids = tokenizer.encode(action)
        ids += action_ids
        mask += [1] * len(action_ids)
        obs, reward, terminated, truncated, info = env.step(action)
        used_tool = used_tool or "tool" in info
        ids += obs["tokens"].tolist()
        mask += [0] * len(obs["tokens"])
        if terminated or truncated:
            return SFTExample(ids, mask, float(reward), used_tool)


def collect_sft_examples(
    env_id: str,
    num: int,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    split: str = "train",
    mix: float = 0.0,
    seed: int = 0,
    teacher: str | None = None,
    progress: bool = False,
) -> list[SFTExample]:
    """``num`` episodes on distinct tasks of ``split``: the teacher's (the env's
    oracle unless ``teacher`` names a policy class), with a fraction ``mix``
    (rounded, placed at seeded random positions) played by
    :class:`GuessPolicy` instead. ``progress`` shows a bar."""
    env = vt_envs.make(env_id, split=split, **dict(env_kwargs or {}))
    rng = random.Random(seed)
    try:
        indices = rng.sample(range(len(env.tasks)), min(num, len(env.tasks)))
        guessing = set(rng.sample(range(len(indices)), round(mix * len(indices))))
        demonstrator, guesser = _teacher(env_id, teacher), GuessPolicy(rng)
        episodes = progress_bar(
            list(enumerate(indices)), desc="SFT episodes", unit="ep", enabled=progress
        )
        return [
            _play(env, guesser if i in guessing else demonstrator, env.tasks[index])
            for i, index in episodes
        ]
    finally:
        env.close()


def _teacher(env_id: str, teacher: str | None) -> Policy:
    if teacher is None:
        return vt_envs.oracle_for(env_id)
    module, _, name = teacher.partition(":")
    try:
        policy_class = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise InvalidConfigError(
            f"SFT teacher {teacher!r} cannot be imported ({error}); give 'module:Class' of "
            "a Policy, e.g. 'vt_envs.domains.math.oracle:MathCodePolicy'"
        ) from error
    try:
        policy = policy_class() if isinstance(policy_class, type) else None
    except TypeError:  # it needs arguments
        policy = None
    if not isinstance(policy, Policy):
        raise InvalidConfigError(
            f"SFT teacher {teacher!r} is not a Policy class that takes no arguments "
            f"(got {policy_class!r}); give 'module:Class' of one, e.g. "
            "'vt_envs.domains.math.oracle:MathCodePolicy'"
        )
    return policy


def collate(examples: Sequence[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``examples`` into ``input_ids``, ``attention_mask``, ``loss_mask`` ``[B, L]``."""
    length = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), length), dtype=torch.long)
    loss = torch.zeros((len(examples), length), dtype=torch.float32)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        ids[row, :n] = torch.tensor(e.input_ids)
        attn[row, :n] = 1
        loss[row, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def sft_loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token-mean cross-entropy over tokens with ``loss_mask`` 1 (aligned: token t
    is predicted from the logits at t - 1). ``labels`` default to ``input_ids``;
    labels where ``loss_mask`` is 0 never affect the loss."""
    labels = input_ids if labels is None else labels
    # The LM head runs only where the loss is taken (the 2048-wide head dominates a
    # tiny model's compute), and the rows' shared prefix (the system prompt, before
    # any loss position) runs through the decoder once (vt_train.prefix).
    need = loss_mask[:, 1:] > 0  # column h: the hidden state at h predicts token h + 1
    hidden, skip = decoder_hidden(
        model.get_decoder(), input_ids, attention_mask, first_needed=first_selected(need)
    )
    where = need[:, skip:]
    logits = model.get_output_embeddings()(hidden[:, :-1][where]).float()
    nll = nn.functional.cross_entropy(logits, labels[:, 1 + skip :][where], reduction="none")
    weight = loss_mask[:, 1 + skip :][where].float()
    return (nll * weight).sum() / weight.sum().clamp(min=1.0)


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def run_sft(
    config: SFTConfig, model: nn.Module, tokenizer: Any = None, *, progress: bool = False
) -> dict[str, Any]:
    """Train ``model`` in place on oracle (and guessing) episodes; return metrics.

    ``progress`` shows bars for the collection and the training steps (with
    the running loss).

    Metrics: ``losses`` (``(step, loss)`` every ``log_every`` steps),
    ``final_loss`` (mean of the last 10 steps), ``collect_s``, ``train_s``,
    ``num_examples``, ``oracle_reward`` (mean reward of the oracle episodes:
    1.0 if the env and its oracle agree), ``tool_use_fraction`` of the data.
    """
    tok = vt_envs.load_tokenizer(tokenizer)
    start = time.perf_counter()
    examples = collect_sft_examples(
        config.env_id,
        config.num_trajectories,
        env_kwargs=config.env_kwargs,
        split=config.split,
        mix=config.mix,
        seed=config.seed,
        teacher=config.teacher,
        progress=progress,
    )
    collect_s = time.perf_counter() - start
    oracle = [e.reward for e in examples if e.used_tool]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98)
    )
    rng = random.Random(config.seed + 1)
    model.train()
    losses, recent = [], []
    start = time.perf_counter()
    bar = progress_bar(range(config.steps), desc="SFT steps", enabled=progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = config.lr * _lr_factor(step, config.warmup_steps, config.steps)
        batch = collate([rng.choice(examples) for _ in range(config.batch_size)], tok.pad_token_id)
        loss = sft_loss(model, **batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        recent = ([*recent, loss.item()])[-10:]
        if step % config.log_every == 0 or step == config.steps - 1:
            losses.append((step, loss.item()))
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}", refresh=False)
    model.eval()
    return {
        "losses": losses,
        "final_loss": sum(recent) / len(recent),
        "collect_s": collect_s,
        "train_s": time.perf_counter() - start,
        "num_examples": len(examples),
        "oracle_reward": sum(oracle) / len(oracle) if oracle else float("nan"),
        "tool_use_fraction": sum(e.used_tool for e in examples) / len(examples),
    }


# ---------------------------------------------------------------- generation


def evaluate(
    model: nn.Module,
    tokenizer: Any = None,
    env_id: str = "VT-Lookup-v0",
    split: str = "test",
    episodes: int = 200,
    greedy: bool = True,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    max_new_tokens: int = 8,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Play ``episodes`` held-out episodes with ``model`` through the trainer's
    own path (:class:`~vt_train.engines.hf.HFEngine` +
    :func:`vt_train.evaluation.evaluate`): greedy, or sampled at T=1.
    ``progress`` shows a bar."""
    from vt_envs.core.loop import run_sync
    from vt_envs.vector import ToolVectorEnv
    from vt_train.engines.hf import HFEngine
    from vt_train.evaluation import evaluate as evaluate_engine

    tok = vt_envs.load_tokenizer(tokenizer)
    venv = ToolVectorEnv(
        [
            vt_envs.make(env_id, split=split, tokenizer=tok, **dict(env_kwargs or {}))
            for _ in range(min(episodes, 64))
        ]
    )
    engine = HFEngine(model, tok, seed=seed)
    tasks = venv.envs[0].unwrapped.tasks  # by index: ids() would generate the whole split
    task_ids = [tasks[i].id for i in range(min(episodes, len(tasks)))]
    start = time.perf_counter()
    try:
        result = run_sync(
            evaluate_engine(
                engine,
                venv,
                task_ids,
                max_new_tokens=max_new_tokens,
                temperature=0.0 if greedy else 1.0,
                seed=seed,
                progress=progress,
                desc=f"SFT eval ({'greedy' if greedy else 'T=1'})",
            ),
            method="sft.evaluate",
            async_method="vt_train.evaluation.evaluate",
        )
    finally:
        venv.close()
    model.train()
    return {
        "accuracy": result.accuracy,
        "tool_use_rate": result.tool_use_rate,
        "mean_turns": result.mean_turns,
        "episodes": result.episodes,
        "seconds": time.perf_counter() - start,
    }


def _default_mix_phase() -> SFTConfig:
    return SFTConfig(steps=60, mix=0.7, lr=1e-3, warmup_steps=5)


@dataclass
class SFTRunConfig:
    """``vt-train sft``: build the tiny model, warm it up, evaluate, save.

    Two phases, because a tiny model learns to copy (the key, the tool's
    value) only from tool-using data, and guesses slow that down: first
    ``sft`` (oracle only by default) teaches the format and copying; then
    ``mix_phase`` (70% guesses by default) makes the policy call the tool
    only sometimes, leaving RL a decision to learn.

    Attributes:
        model: the tiny model's shape and init seed.
        sft: phase 1 (oracle trajectories, ``mix`` 0 by default).
        mix_phase: phase 2's mixture and schedule (``mix``, ``steps``, ``lr``,
            ...); its env, teacher and split are phase 1's, and its seed is
            phase 1's plus one (other episodes, other guesses).
        mix_steps: overrides ``mix_phase.steps`` (0: no phase 2).
        output_dir: where the model, tokenizer and ``sft_metrics.json`` go.
        eval_episodes: held-out (test split) episodes evaluated at the end (0: none).
        eval_max_new_tokens: the most tokens one evaluation turn may generate.
        threads: ``torch.set_num_threads`` (1 is fastest on a loaded 2-core box).
        progress: progress bars for collection, training and evaluation.
    """

    model: TinyModelConfig = field(default_factory=lambda: TinyModelConfig())
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=300, lr=1e-3))
    mix_phase: SFTConfig = field(default_factory=_default_mix_phase)
    mix_steps: int = 60
    output_dir: str = "runs/sft"
    eval_episodes: int = 200
    eval_max_new_tokens: int = 8
    threads: int = 1
    progress: bool = True


def mix_phase_config(config: SFTRunConfig) -> SFTConfig:
    """Phase 2 as it runs: ``mix_phase`` on phase 1's env, teacher and split."""
    first = config.sft
    return SFTConfig(
        **{
            **config.mix_phase.__dict__,
            "steps": config.mix_steps,
            "env_id": first.env_id,
            "env_kwargs": dict(first.env_kwargs),
            "teacher": first.teacher,
            "split": first.split,
            "seed": first.seed + 1,
        }
    )


def run_sft_command(config: SFTRunConfig) -> dict[str, Any]:
    """Run :class:`SFTRunConfig`; return (and save) the metrics summary."""
    import json
    from pathlib import Path

    from vt_train.model import build_tiny_model, save_pretrained_with_tokenizer

    torch.set_num_threads(config.threads)
    tok = vt_envs.load_tokenizer()
    model = build_tiny_model(config.model, tok)
    progress = config.progress
    summary: dict[str, Any] = {
        "phase1": _summary(run_sft(config.sft, model, tok, progress=progress))
    }
    if config.mix_steps > 0:
        phase2 = mix_phase_config(config)
        summary["phase2"] = _summary(run_sft(phase2, model, tok, progress=progress))
    for name, greedy in (("greedy", True), ("sampled", False)) if config.eval_episodes else ():
        summary[f"eval_{name}"] = evaluate(
            model,
            tok,
            config.sft.env_id,
            "test",
            config.eval_episodes,
            greedy,
            env_kwargs=config.sft.env_kwargs,
            max_new_tokens=config.eval_max_new_tokens,
            progress=progress,
        )
    out = Path(config.output_dir)
    save_pretrained_with_tokenizer(model, tok, out / "model")
    (out / "sft_metrics.json").write_text(json.dumps(summary, indent=2))
    summary["model_dir"] = str(out / "model")
    return summary


def _summary(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k != "losses"}
