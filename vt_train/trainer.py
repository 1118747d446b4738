"""The RL trainer: rollout → old/ref logprobs → advantages → updates → weight sync.

One :meth:`Trainer.step` reads top to bottom like the algorithm:

1. sample ``tasks_per_step`` train tasks (a pure function of ``(seed, step)``,
   so a resumed run draws the same ones) and play ``n`` episodes of each
   through the vector env with the rollout engine (trajectory-level async);
2. drop all-equal groups if the algorithm filters them (DAPO);
3. old logprobs (recomputed by the trainer's model, or the engine's rollout
   logprobs), reference logprobs (if KL is on) and values (PPO);
4. advantages from the algorithm's estimator;
5. ``epochs`` passes of minibatch updates, each minibatch split into
   micro-batches whose losses are normalized by the minibatch-wide counts;
6. push the new weights into the rollout engine and check that its logprobs
   on a probe now agree with the trainer's (catches stale weights);
7. log metrics (JSONL + TensorBoard).
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

import vt_envs
from vt_envs.core.loop import run_sync
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.core.vector import ToolVectorEnv
from vt_envs.errors import InvalidConfigError
from vt_train.algorithms import (
    ADVANTAGES,
    POLICY_LOSSES,
    aggregate,
    group_filter_mask,
    kl_penalty,
    kl_token_rewards,
    loss_normalizers,
    masked_mean,
    value_loss,
)
from vt_train.batch import TrainBatch
from vt_train.config import TrainConfig, config_to_dict
from vt_train.ds_engine import DeepSpeedModel
from vt_train.engines import assert_in_sync, make_engine
from vt_train.engines.base import SamplingParams
from vt_train.evaluation import EvalResult, evaluate, summarize
from vt_train.model import (
    CriticModel,
    TinyModelConfig,
    build_tiny_model,
    save_pretrained_with_tokenizer,
)
from vt_train.rollout import collect
from vt_train.run_dir import MetricsLogger, write_transcripts
from vt_train.trajectory import Trajectory

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _load_policy(config: TrainConfig, tokenizer: Any) -> torch.nn.Module:
    path = config.init_from or config.model.path
    if path is not None:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).float()
    return build_tiny_model(
        TinyModelConfig(**{"seed": config.seed, **config.model.tiny}), tokenizer
    )


def forward_logprobs(
    model: Any, batch: TrainBatch, temperature: float, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-aligned ``log_softmax(logits / T)`` of each token (and the
    per-token entropy of that distribution when asked), ``[B, L]``."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits = logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    logprobs = torch.nn.functional.pad(picked, (1, 0))
    ent = None
    if entropy:
        ent = torch.nn.functional.pad(-(logp_all.exp() * logp_all).sum(-1), (1, 0))
    return logprobs, ent


class Trainer:
    """Owns the models, the engines and the envs of one run (see the module docstring)."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.algo = config.algorithm_config()
        self.run_dir = Path(config.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(config.torch_threads)
        _seed_everything(config.seed)

        self.tokenizer = load_tokenizer(
            config.model.tokenizer or config.init_from or config.model.path
        )
        policy = _load_policy(config, self.tokenizer)
        self.temperature = config.rollout.temperature or 1.0  # greedy rollouts: score at T=1
        self.actor = DeepSpeedModel(
            policy,
            config.deepspeed,
            lr=config.optim.lr,
            betas=config.optim.betas,
            weight_decay=config.optim.weight_decay,
            warmup_steps=config.optim.warmup_steps,
        )
        # Data parallel under torchrun: each rank plays its share of the step's
        # tasks, trajectories are all-gathered, and each rank trains on its
        # rows of every minibatch (DeepSpeed all-reduces the gradients).
        self.rank, self.world = _dist_rank_world()
        if config.rollout.tasks_per_step % self.world:
            raise InvalidConfigError(
                f"rollout.tasks_per_step ({config.rollout.tasks_per_step}) must be a multiple of "
                f"the number of processes ({self.world}) so every rank plays as many tasks"
            )
        self.is_main = self.rank == 0
        if self.is_main:
            (self.run_dir / "config.yaml").write_text(
                yaml.safe_dump(config_to_dict(config), sort_keys=False)
            )
        self.reference = None
        if self.algo.kl_coef > 0:
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        self.critic = None
        if self.algo.use_critic:
            self.critic = DeepSpeedModel(
                CriticModel.from_policy(policy),
                config.deepspeed,
                lr=config.optim.critic_lr,
                weight_decay=config.optim.weight_decay,
                warmup_steps=config.optim.warmup_steps,
            )
        self.engine = make_engine(
            config.rollout.engine,
            **self._engine_kwargs(policy),
        )

        env_kwargs = dict(config.env.kwargs)
        batch = config.rollout.tasks_per_step // self.world * config.rollout.n
        self.train_env = ToolVectorEnv(
            [
                vt_envs.make(config.env.id, split="train", tokenizer=self.tokenizer, **env_kwargs)
                for _ in range(batch)
            ]
        )
        eval_width = min(config.env.eval_episodes, 64)
        self.eval_env = ToolVectorEnv(
            [
                vt_envs.make(
                    config.env.id,
                    split=config.env.eval_split,
                    tokenizer=self.tokenizer,
                    **env_kwargs,
                )
                for _ in range(eval_width)
            ]
        )
        self.train_task_ids = self.train_env.envs[0].unwrapped.tasks.ids()
        eval_ids = self.eval_env.envs[0].unwrapped.tasks.ids()
        self.eval_task_ids = eval_ids[: config.env.eval_episodes]
        self.stop = tuple(self.train_env.stop_strings)
        self.metrics = MetricsLogger(
            self.run_dir, tensorboard=config.tensorboard, enabled=self.is_main
        )
        self.step_index = 0
        self.updates = 0

    def _engine_kwargs(self, policy: torch.nn.Module) -> dict[str, Any]:
        kwargs = dict(self.config.rollout.engine_kwargs)
        if self.config.rollout.engine == "hf":
            kwargs.setdefault("model", copy.deepcopy(policy))
            kwargs.setdefault("tokenizer", self.tokenizer)
            kwargs.setdefault("seed", self.config.seed)
        elif self.config.rollout.engine == "vllm":
            path = self.run_dir / "weights" / "initial"
            save_pretrained_with_tokenizer(policy, self.config.model.tokenizer, path)
            kwargs.setdefault("model_path", str(path))
            kwargs.setdefault("tokenizer", self.tokenizer)
        return kwargs

    # ------------------------------------------------------------ rollouts

    def _sample_tasks(self, step: int) -> list[str]:
        rng = np.random.default_rng([self.config.seed, step])
        picks = rng.choice(
            len(self.train_task_ids),
            size=self.config.rollout.tasks_per_step,
            replace=len(self.train_task_ids) < self.config.rollout.tasks_per_step,
        )
        return [self.train_task_ids[i] for i in picks]

    def _sampling(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop=self.stop,
        )

    def evaluate(self, temperature: float = 0.0) -> EvalResult:
        """Episodes on the held-out split (``env.eval_episodes`` tasks), greedy by default."""
        r = self.config.rollout
        return run_sync(
            evaluate(
                self.engine,
                self.eval_env,
                self.eval_task_ids,
                max_new_tokens=r.max_new_tokens,
                temperature=temperature,
                seed=self.config.seed,
                max_context=r.max_context,
            ),
            method="Trainer.evaluate",
            async_method="vt_train.evaluation.evaluate",
        )

    def _evaluate_and_log(self, *, transcripts: bool = False) -> dict[str, float]:
        """Evaluate at every ``env.eval_temperatures`` (on rank 0); log and return the metrics."""
        metrics: dict[str, float] = {}
        if not self.is_main:
            return _broadcast(None)
        for temperature in self.config.env.eval_temperatures:
            result = self.evaluate(temperature)
            prefix = "eval/" if temperature == 0 else f"eval_t{temperature:g}/"
            metrics.update(result.metrics(prefix))
            if transcripts and temperature == self.config.env.eval_temperatures[0]:
                write_transcripts(
                    self.run_dir / "transcripts" / f"eval_step{self.step_index:04d}.txt",
                    result.trajectories[:8],
                    self.tokenizer,
                )
        self.metrics.log(metrics, step=self.step_index)
        return _broadcast(metrics) if self.world > 1 else metrics

    # -------------------------------------------------------------- update

    @torch.no_grad()
    def _prepare(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """Attach old/ref logprobs, values, advantages and returns to ``batch``."""
        cfg, algo = self.config, self.algo
        mask = batch.loss_mask
        extras: dict[str, torch.Tensor] = {}
        self.actor.eval()
        if cfg.rollout.logprobs == "recompute":
            old = torch.cat(
                [
                    forward_logprobs(self.actor, mb, self.temperature)[0]
                    for mb in batch.split(cfg.optim.micro_batch_size, trim=False)
                ]
            )
        else:
            old = batch.rollout_logprobs
        extras["old_logprobs"] = old * mask
        metrics = {
            "rollout/logprob_abs_diff": float(
                masked_mean((old - batch.rollout_logprobs).abs(), mask)
            )
        }
        token_rewards = None
        if self.reference is not None:
            ref = torch.cat(
                [
                    forward_logprobs(self.reference, mb, self.temperature)[0]
                    for mb in batch.split(cfg.optim.micro_batch_size, trim=False)
                ]
            )
            extras["ref_logprobs"] = ref
            if algo.kl_in_reward:
                token_rewards = kl_token_rewards(old, ref, mask, algo)
        values = None
        if self.critic is not None:
            self.critic.eval()
            values = torch.cat(
                [
                    self.critic(mb.input_ids, mb.attention_mask)
                    for mb in batch.split(cfg.optim.micro_batch_size, trim=False)
                ]
            ).float()
            extras["old_values"] = values
        advantages, returns = ADVANTAGES.get(algo.advantage)(
            batch.rewards, mask, batch.group_ids, algo, values=values, token_rewards=token_rewards
        )
        extras.update(advantages=advantages, returns=returns)
        metrics["rollout/advantage_abs_mean"] = float(masked_mean(advantages.abs(), mask))
        return batch.with_extras(**extras), metrics

    def _gather(self, local: list[Trajectory]) -> list[Trajectory]:
        """All ranks' trajectories in global task-major order, group id = global task index.

        Rank ``r`` played tasks ``r, r + world, ...`` of the step, ``n`` samples each.
        """
        n = self.config.rollout.n
        shares = [local]
        if self.world > 1:
            import torch.distributed as dist

            shares = [None] * self.world
            dist.all_gather_object(shares, local)
        trajectories = []
        for task in range(self.config.rollout.tasks_per_step):
            rank, k = task % self.world, task // self.world
            for trajectory in shares[rank][k * n : (k + 1) * n]:
                trajectory.group_id = task
                trajectories.append(trajectory)
        return trajectories

    def _dummy_backward(self) -> None:
        """A zero-gradient backward, so a rank with no rows joins the all-reduce."""
        ids = torch.full((1, 1), self.tokenizer.pad_token_id)
        self.actor.backward(self.actor(input_ids=ids).logits.float().sum() * 0.0)
        if self.critic is not None:
            self.critic.backward(self.critic(ids).float().sum() * 0.0)

    def _micro_step(self, mb: TrainBatch, norm: Mapping[str, float]) -> dict[str, float]:
        algo = self.algo
        mask = mb.loss_mask
        logprobs, entropy = forward_logprobs(self.actor, mb, self.temperature, entropy=True)
        loss_mat, pg_metrics = POLICY_LOSSES.get(algo.policy_loss)(
            logprobs, mb.extras["old_logprobs"], mb.extras["advantages"], mask, algo
        )
        agg = dict(num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"], config=algo)
        loss = aggregate(loss_mat, mask, algo.loss_agg, **agg)
        metrics = {k: float(v) for k, v in pg_metrics.items()}
        metrics["policy/pg_loss"] = float(loss.detach())
        if self.reference is not None and not algo.kl_in_reward:
            kl = aggregate(
                kl_penalty(logprobs, mb.extras["ref_logprobs"], mask, algo),
                mask,
                algo.loss_agg,
                **agg,
            )
            loss = loss + algo.kl_coef * kl
            metrics["policy/kl_ref"] = float(kl.detach())
        ent = aggregate(entropy, mask, algo.loss_agg, **agg)
        if algo.entropy_coef:
            loss = loss - algo.entropy_coef * ent
        else:
            ent = ent.detach()
        metrics["policy/entropy"] = float(ent.detach())
        # DeepSpeed averages gradients over ranks; the loss is normalized by
        # the global counts, so scale by the world size to get their sum.
        self.actor.backward(loss * self.world)
        if self.critic is not None:
            values = self.critic(mb.input_ids, mb.attention_mask).float()
            v_mat, v_metrics = value_loss(
                values, mb.extras["old_values"], mb.extras["returns"], mask, algo
            )
            v_loss = algo.vf_coef * aggregate(v_mat, mask, algo.loss_agg, **agg)
            self.critic.backward(v_loss * self.world)
            metrics["critic/vf_loss"] = float(v_loss.detach())
            metrics.update({k: float(v) for k, v in v_metrics.items()})
        return metrics

    def _update(self, batch: TrainBatch) -> dict[str, float]:
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_index)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        for _ in range(cfg.optim.epochs):
            for minibatch in batch.minibatches(
                cfg.optim.minibatch_size, shuffle=True, generator=generator
            ):
                norm = loss_normalizers(minibatch.loss_mask)  # global: the whole minibatch
                rows = minibatch.select(
                    range(self.rank, len(minibatch), self.world), normalize=False
                )
                micro = rows.split(cfg.optim.micro_batch_size) if len(rows) else []
                # every rank runs as many backward passes (each one all-reduces)
                per_rank = -(-len(minibatch) // self.world)
                for i in range(-(-per_rank // cfg.optim.micro_batch_size)):
                    if i >= len(micro):
                        self._dummy_backward()
                        continue
                    for key, value in self._micro_step(micro[i], norm).items():
                        sums[key] = sums.get(key, 0.0) + value
                        counts[key] = counts.get(key, 0) + 1
                grad_norm = self.actor.step(self.updates)
                if self.critic is not None:
                    self.critic.step(self.updates)
                self.updates += 1
                sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + grad_norm
                counts["policy/grad_norm"] = counts.get("policy/grad_norm", 0) + 1
        return {k: sums[k] / counts[k] for k in sums}

    def _sync_weights(self, probe: Sequence[Sequence[int]]) -> dict[str, float]:
        """Push the actor's weights into the rollout engine, then check agreement."""
        state = self.actor.full_state_dict()
        self.engine.load_weights(state)
        tol = self.config.rollout.sync_check_tol
        if tol is None or not probe:
            return {}
        model = self.actor.module

        @torch.no_grad()
        def reference(seqs: Sequence[Sequence[int]], temperature: float) -> list[list[float]]:
            model.eval()
            out = []
            for seq in seqs:
                ids = torch.tensor([list(seq)])
                logits = model(input_ids=ids).logits[0, :-1].float() / temperature
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
                out.append(lp.tolist())
            return out

        # At temperature 1: the check is about the weights, and vLLM scores only at T=1.
        result = assert_in_sync(self.engine, reference, probe, 1.0, tol=tol)
        return {"sync/max_abs_logprob_diff": result["max_abs_diff"]}

    # ---------------------------------------------------------------- loop

    def rollout(self) -> list[Trajectory]:
        """Play this step's tasks (this rank's share) and gather every rank's trajectories."""
        cfg = self.config
        tasks = self._sample_tasks(self.step_index)
        local = run_sync(
            collect(
                self.engine,
                self.train_env,
                tasks[self.rank :: self.world],
                n_samples=cfg.rollout.n,
                sampling=self._sampling(),
                seed=cfg.seed * 100_003 + self.step_index * 1_009 + self.rank,
                mode=cfg.rollout.mode,
                max_context=cfg.rollout.max_context,
            ),
            method="Trainer.rollout",
            async_method="vt_train.rollout.collect",
        )
        return self._gather(local)

    def learn(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Update the policy (and critic) on ``trajectories``; push the new weights."""
        cfg, algo = self.config, self.algo
        metrics = {f"rollout/{k}": v for k, v in summarize(trajectories).items()}
        batch = TrainBatch.from_trajectories(trajectories, pad_token_id=self.tokenizer.pad_token_id)
        keep = group_filter_mask(batch.rewards, batch.group_ids)
        metrics["rollout/all_equal_group_share"] = 1.0 - float(keep.float().mean())
        if algo.filter_groups:
            batch = (
                batch.select(torch.nonzero(keep).flatten(), normalize=True) if keep.any() else None
            )
        if batch is not None and len(batch):
            batch, prep_metrics = self._prepare(batch)
            metrics.update({**prep_metrics, **self._update(batch)})
            probe = [t.input_ids[: cfg.rollout.max_context] for t in trajectories[:2]]
            metrics.update(self._sync_weights(probe))
        return metrics

    def step(self) -> dict[str, float]:
        """One RL step (:meth:`rollout` then :meth:`learn`); returns its metrics (also logged)."""
        t0 = time.perf_counter()
        trajectories = self.rollout()
        t1 = time.perf_counter()
        metrics = self.learn(trajectories)
        t2 = time.perf_counter()
        tokens = sum(len(t.input_ids) for t in trajectories)
        metrics.update(
            {
                "step": self.step_index,
                "time/rollout_s": t1 - t0,
                "time/update_s": t2 - t1,
                "perf/train_tokens_per_s": tokens / max(t2 - t1, 1e-9),
                "perf/rollout_tokens_per_s": tokens / max(t1 - t0, 1e-9),
            }
        )
        self.step_index += 1
        self.metrics.log(metrics, step=self.step_index)
        return metrics

    def train(self, *, progress: bool = True) -> dict[str, Any]:
        """Run until ``config.steps``; evaluate before, during and after; save at the end."""
        cfg = self.config
        summary: dict[str, Any] = {}
        if self.step_index == 0:
            summary["before"] = self._evaluate_and_log(transcripts=True)
        bar = _progress(range(self.step_index, cfg.steps), progress)
        for _ in bar:
            metrics = self.step()
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(
                    reward=f"{metrics['rollout/mean_reward']:.2f}",
                    tool=f"{metrics['rollout/tool_use_rate']:.2f}",
                )
            last = self.step_index == cfg.steps  # the final evaluation follows the loop
            if cfg.eval_every and self.step_index % cfg.eval_every == 0 and not last:
                self._evaluate_and_log()
            if cfg.save_every and self.step_index % cfg.save_every == 0:
                self.save_checkpoint()
        summary["after"] = self._evaluate_and_log(transcripts=True)
        self.save_checkpoint()
        state = self.actor.full_state_dict()  # collective under ZeRO-3
        if self.is_main:
            save_pretrained_with_tokenizer(
                self.actor.module,
                self.config.model.tokenizer,
                self.run_dir / "final",
                state_dict=state,
            )
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        return summary

    # --------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        """Model, optimizer and RNG state; :meth:`load_checkpoint` resumes exactly."""
        directory = self.run_dir / "checkpoints"
        tag = f"step{self.step_index:05d}"
        state = {
            "step_index": self.step_index,
            "updates": self.updates,
            "rng_python": random.getstate(),
            "rng_numpy": np.random.get_state(),
            "rng_torch": torch.get_rng_state(),
        }
        self.actor.save_checkpoint(directory / "actor", tag, state)
        if self.critic is not None:
            self.critic.save_checkpoint(directory / "critic", tag, {})
        if self.is_main:
            (directory / "latest").write_text(tag)
        return directory / "actor" / tag

    def load_checkpoint(self, tag: str | None = None) -> None:
        directory = self.run_dir / "checkpoints"
        tag = tag or (directory / "latest").read_text().strip()
        state = self.actor.load_checkpoint(directory / "actor", tag)
        if self.critic is not None:
            self.critic.load_checkpoint(directory / "critic", tag)
        self.step_index, self.updates = state["step_index"], state["updates"]
        random.setstate(state["rng_python"])
        np.random.set_state(state["rng_numpy"])
        torch.set_rng_state(state["rng_torch"])
        self.engine.load_weights(self.actor.full_state_dict())

    def close(self) -> None:
        self.train_env.close()
        self.eval_env.close()
        run_sync(self.engine.aclose(), method="Trainer.close", async_method="engine.aclose")


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (no-op in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _progress(iterable: Any, enabled: bool) -> Any:
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the train extra
        return iterable
    return tqdm(iterable, desc="RL steps", dynamic_ncols=True)
