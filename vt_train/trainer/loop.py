"""The :class:`Trainer` (see :mod:`vt_train.trainer`): built in named steps, then
:meth:`Trainer.step` = :meth:`~Trainer.rollout` + :meth:`~Trainer.learn`, and
:meth:`Trainer.train` runs the steps with evaluations and checkpoints between them.

Its methods live by concern in mixins: building (:mod:`.build`), episodes
(:mod:`.rollouts`), updates (:mod:`.update`) and checkpoints (:mod:`.checkpoint`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from vt_envs.core.loop import run_sync
from vt_envs.errors import InvalidConfigError
from vt_train.algorithms import group_filter_mask
from vt_train.algorithms.shaping import shaping_metrics
from vt_train.batch import TrainBatch
from vt_train.config import TrainConfig, resolve_device, resolved_config_dict
from vt_train.ds_engine import DeepSpeedModel
from vt_train.engines import make_engine
from vt_train.evaluation import domain_metrics, summarize
from vt_train.forwards import Forwards
from vt_train.lockstep import Lockstep
from vt_train.model import CriticModel, save_pretrained_with_tokenizer
from vt_train.progress import progress_bar
from vt_train.run_dir import MetricsLogger
from vt_train.trainer.build import _Building, _processor_dir
from vt_train.trainer.checkpoint import _Checkpoints
from vt_train.trainer.distributed import (
    _all_gather,
    _dist_rank_world,
    _placement,
    _seed_everything,
)
from vt_train.trainer.rollouts import _Rollouts
from vt_train.trainer.update import _Updates
from vt_train.trajectory import Trajectory
from vt_train.vision import ImageInputs, is_vision_language
from vt_train.vl_model import copy_processor_files
from vt_train.weight_sync import WeightSync, probe_sequences


def _all_equal_share(played: Sequence[Trajectory], n: int) -> float:
    """The share of ``played``'s groups (``n`` consecutive trajectories) whose rewards
    are all equal: groups that give GRPO no signal."""
    groups = [played[g : g + n] for g in range(0, len(played), n)]
    return sum(len({t.reward for t in group}) == 1 for group in groups) / max(len(groups), 1)


class Trainer(_Building, _Rollouts, _Updates, _Checkpoints):
    """Owns the models, the engines and the envs of one run (see :mod:`vt_train.trainer`)."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.algo = config.algorithm_config()
        self.run_dir = Path(config.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        device = self._start_process()
        policy, reference, critic = self._load_models()
        # Before DeepSpeed takes the policy (under ZeRO-3 it partitions its parameters).
        engine_kwargs = self._engine_kwargs(policy, device) if self.placement.leads else None
        self._wrap_actor(policy)
        self._join_world()
        if self.is_main:
            (self.run_dir / "config.yaml").write_text(
                yaml.safe_dump(resolved_config_dict(config), sort_keys=False)
            )
        self._wrap_reference_and_critic(reference, critic)
        self._start_engine(engine_kwargs)
        self._make_envs()
        self.metrics = MetricsLogger.for_config(config, enabled=self.is_main)
        self.step_index = 0
        self.updates = 0
        self.sampling_rounds = 0  # rollout rounds of the last dynamic-sampling step
        # Every trajectory the last dynamic-sampling step played, and what it returned:
        # rollout metrics describe the policy, not the groups kept for training.
        self._played: tuple[list[Trajectory], list[Trajectory]] | None = None

    # ------------------------------------------------------- construction

    def _start_process(self) -> str:
        """Threads, seeds and the accelerator of this process, and its place among the
        ranks (``self.placement``, ``self.players``); returns the resolved device."""
        config = self.config
        torch.set_num_threads(config.torch_threads)
        _seed_everything(config.seed)
        device = resolve_device(config.device)
        if device == "cpu":  # DeepSpeed picks CUDA whenever it can see it
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # Decided before any model exists: only engine leaders build (and copy) an engine.
        self.placement, self.players = _placement(config, device)
        return device

    def _load_models(
        self,
    ) -> tuple[torch.nn.Module, torch.nn.Module | None, CriticModel | None]:
        """The policy, reference and critic (:meth:`_build_models`), the tokenizer, and
        for a vision-language policy its processor and :class:`ImageInputs`."""
        config = self.config
        self.processor_dir = _processor_dir(config, self.run_dir)
        path = config.init_from or config.model.path
        # ZeRO-3 builds models loaded from a directory partitioned: no rank holds a whole one.
        self.partitioned = config.deepspeed.zero_stage == 3 and config.deepspeed.zero_init
        self.partitioned = self.partitioned and path is not None
        policy, reference, critic = self._build_models(config)
        self.vision = is_vision_language(policy)
        if self.vision and self.processor_dir is None:
            raise InvalidConfigError(
                f"the policy ({type(policy).__name__}) is a vision-language model but no "
                "processor was found: set model.processor to its processor directory (the one "
                "with preprocessor_config.json)"
            )
        self.image_inputs = ImageInputs(str(self.processor_dir)) if self.vision else None
        return policy, reference, critic

    def _wrap_actor(self, policy: torch.nn.Module) -> None:
        """The policy as the DeepSpeed-trained actor (``self.actor``, on ``self.device``)."""
        config = self.config
        # Shared by every LogprobModel: on several ranks their forwards agree on the
        # module calls they make (vt_train.lockstep); enabled once the world is known.
        self.lockstep = Lockstep()
        self.actor = DeepSpeedModel(
            self._logprob_model(policy),
            config.deepspeed,
            lr=config.optim.lr,
            betas=config.optim.betas,
            weight_decay=config.optim.weight_decay,
            warmup_steps=config.optim.warmup_steps,
        )
        self.device = self.actor.device

    def _join_world(self) -> None:
        """This rank and the world size, and the :class:`Forwards` that score on them."""
        config = self.config
        # Data parallel under torchrun: each engine leader plays its share of the
        # step's tasks (vt_train.placement), trajectories are all-gathered, and each
        # rank trains on its rows of every minibatch (DeepSpeed all-reduces gradients).
        self.rank, self.world = _dist_rank_world()
        engines = len(self.players)
        if config.rollout.tasks_per_step % engines:
            raise InvalidConfigError(
                f"rollout.tasks_per_step ({config.rollout.tasks_per_step}) must be a multiple of "
                f"the number of rollout engines ({engines}: {self.world} ranks, one engine per "
                "tensor-parallel group) so every engine plays as many tasks"
            )
        self.is_main = self.rank == 0
        self.lockstep.enabled = self.world > 1
        self.forwards = Forwards(
            device=self.device,
            lockstep=self.lockstep,
            rank=self.rank,
            world=self.world,
            temperature=self.temperature,
            pad_token_id=self.tokenizer.pad_token_id,
            image_inputs=self.image_inputs,
            vision_config=self.actor.module.lm.config if self.vision else None,
        )

    def _wrap_reference_and_critic(
        self, reference: torch.nn.Module | None, critic: CriticModel | None
    ) -> None:
        """The frozen KL reference and the DeepSpeed-trained critic (``None`` when off)."""
        config = self.config
        self.reference = None if reference is None else self._frozen(self._logprob_model(reference))
        self.critic = None
        if critic is not None:
            self.critic = DeepSpeedModel(
                critic,
                config.deepspeed,
                lr=config.optim.critic_lr,
                weight_decay=config.optim.weight_decay,
                warmup_steps=config.optim.warmup_steps,
            )

    def _start_engine(self, engine_kwargs: dict[str, Any] | None) -> None:
        """This rank's rollout engine (``None`` on a rank that leads none) and the
        :class:`WeightSync` that pushes the actor's weights into it."""
        # Ranks that lead no engine (the rest of a tensor-parallel group) play no tasks.
        self.engine = (
            make_engine(self.config.rollout.engine, **engine_kwargs)
            if engine_kwargs is not None
            else None
        )
        self.weight_sync = WeightSync(
            self.actor, self.config, self._reference_logprobs,
            gather=lambda value: _all_gather(value, self.world), reporter=self.players[0],
        )  # fmt: skip

    @property
    def temperature(self) -> float:
        return self.config.rollout.temperature or 1.0  # greedy rollouts: score at T=1

    # ---------------------------------------------------------------- loop

    def learn(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Update the policy (and critic) on ``trajectories``; push the new weights."""
        cfg, algo = self.config, self.algo
        played = trajectories
        if self._played is not None and self._played[0] is trajectories:
            played = self._played[1]  # every round dynamic sampling played, not only the kept
        self._played = None
        self._shape(trajectories)  # a no-op on what rollout() shaped already
        metrics = {f"rollout/{k}": v for k, v in summarize(played).items()}
        if self.config.env.mixture:  # each domain's reward, accuracy, turns, tool use
            metrics.update(domain_metrics(played, "rollout/"))
        if self.sampling_rounds:
            metrics["rollout/sampling_rounds"] = float(self.sampling_rounds)
        metrics.update(shaping_metrics(played))
        batch = TrainBatch.from_trajectories(trajectories, pad_token_id=self.tokenizer.pad_token_id)
        keep = group_filter_mask(batch.rewards, batch.group_ids)
        if played is not trajectories:
            metrics["rollout/all_equal_group_share"] = _all_equal_share(played, cfg.rollout.n)
            trained = int(keep.sum()) if algo.filter_groups else len(trajectories)
            metrics["rollout/trained_share"] = trained / max(len(played), 1)
            # rollout/* describe the policy (every round played); kept/* what trains
            kept = [t for t, k in zip(trajectories, keep.tolist()) if k or not algo.filter_groups]
            metrics.update({f"kept/{k}": v for k, v in summarize(kept).items()} if kept else {})
        else:
            metrics["rollout/all_equal_group_share"] = 1.0 - float(keep.float().mean())
        if algo.filter_groups:
            batch = (
                batch.select(torch.nonzero(keep).flatten(), normalize=True) if keep.any() else None
            )
        if batch is not None and len(batch) and batch.num_tokens:
            span = None
            if self.vision:
                lm_config = self.actor.module.lm.config
                span = (lm_config.vision_start_token_id, lm_config.vision_end_token_id)
            # One token short of the context: vLLM scores a sequence as a prompt that
            # must leave room for one generated token (prompt + 1 <= max_model_len).
            probe, images = probe_sequences(trajectories, cfg.rollout.max_context - 1, span)
            before = self.weight_sync.probe(self.engine, probe, images)  # for the sync check
            batch, prep_metrics = self._prepare(batch)
            metrics.update({**prep_metrics, **self._update(batch)})
            metrics.update(self.weight_sync.sync(self.engine, probe, images, before))
        return metrics

    def step(self) -> dict[str, float]:
        """One RL step (:meth:`rollout` then :meth:`learn`); returns its metrics (also logged).

        ``metrics["step"]`` is the number of steps done, the same step the
        record is logged under.
        """
        t0 = time.perf_counter()
        trajectories = self.rollout()
        t1 = time.perf_counter()
        metrics = self.learn(trajectories)
        t2 = time.perf_counter()
        tokens = sum(len(t.input_ids) for t in trajectories)
        self.step_index += 1
        metrics.update(
            {
                "step": self.step_index,
                "time/rollout_s": t1 - t0,
                "time/update_s": t2 - t1,
                "perf/train_tokens_per_s": tokens / max(t2 - t1, 1e-9),
                "perf/rollout_tokens_per_s": tokens / max(t1 - t0, 1e-9),
            }
        )
        self.metrics.log(metrics, step=self.step_index)
        return metrics

    def train(self, *, progress: bool = True) -> dict[str, Any]:
        """Run until ``config.steps``; evaluate before, during and after; save at the end."""
        cfg = self.config
        summary: dict[str, Any] = {}
        if self.step_index == 0:
            summary["before"] = self._evaluate_and_log(transcripts=True, progress=progress)
        bar = progress_bar(range(self.step_index, cfg.steps), desc="RL steps", enabled=progress)
        for _ in bar:
            metrics = self.step()
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(
                    reward=f"{metrics['rollout/mean_reward']:.2f}",
                    tool=f"{metrics['rollout/tool_use_rate']:.2f}",
                )
            last = self.step_index == cfg.steps  # the final evaluation follows the loop
            if cfg.eval_every and self.step_index % cfg.eval_every == 0 and not last:
                self._evaluate_and_log(progress=progress)
            if cfg.save_every and self.step_index % cfg.save_every == 0:
                self.save_checkpoint()
        summary["after"] = self._evaluate_and_log(transcripts=True, progress=progress)
        self.save_checkpoint()
        state = self.actor.full_state_dict()  # collective under ZeRO-3
        if self.is_main:
            save_pretrained_with_tokenizer(
                self.actor.module.lm, self.tokenizer, self.run_dir / "final", state_dict=state
            )
            if self.vision:
                copy_processor_files(self.processor_dir, self.run_dir / "final")
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        return summary

    def close(self) -> None:
        self.train_env.close()
        self.eval_env.close()
        if self.engine is not None:
            run_sync(self.engine.aclose(), method="Trainer.close", async_method="engine.aclose")
