"""A :class:`~vt_train.trainer.Trainer`'s episodes: a step's tasks (a pure function of
``(seed, step)``, so a resumed run draws the same ones), played ``n`` times each by this
rank's engine, gathered from every engine, shaped, and (DAPO's ``filter_groups``) topped
up by rounds of fresh tasks until enough groups differ; and the held-out evaluation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vt_envs.core.loop import run_sync
from vt_train.algorithms.shaping import shape_rewards
from vt_train.engines.base import SamplingParams
from vt_train.evaluation import EvalResult, evaluate
from vt_train.rollout import collect
from vt_train.trainer.distributed import _broadcast
from vt_train.trajectory import Trajectory


class _Rollouts:
    """The :class:`~vt_train.trainer.Trainer` methods that play episodes (a mixin: they
    read and set the trainer's state)."""

    def _sample_tasks(self, step: int, round_: int = 0) -> list[str]:
        # Round 0 keeps the seed stream of earlier versions; later rounds are new streams.
        key = [self.config.seed, step] if round_ == 0 else [self.config.seed, step, round_]
        rng = np.random.default_rng(key)
        picks = rng.choice(
            len(self.train_tasks),
            size=self.config.rollout.tasks_per_step,
            replace=len(self.train_tasks) < self.config.rollout.tasks_per_step,
        )
        return [self.train_tasks[int(i)].id for i in picks]

    def _sampling(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop=self.stop,
        )

    def evaluate(self, temperature: float = 0.0, *, progress: bool = False) -> EvalResult:
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
                progress=progress,
                desc=f"eval T={temperature:g}",
            ),
            method="Trainer.evaluate",
            async_method="vt_train.evaluation.evaluate",
        )

    def _evaluate_and_log(
        self, *, transcripts: bool = False, progress: bool = False
    ) -> dict[str, float]:
        """Evaluate at every ``env.eval_temperatures`` (on rank 0); log and return the metrics."""
        metrics: dict[str, float] = {}
        if not self.is_main:
            return _broadcast(None)
        for temperature in self.config.env.eval_temperatures:
            result = self.evaluate(temperature, progress=progress)
            prefix = "eval/" if temperature == 0 else f"eval_t{temperature:g}/"
            metrics.update(result.metrics(prefix))
            if transcripts and temperature == self.config.env.eval_temperatures[0]:
                self.metrics.log_transcripts(  # the file, and a table for the trackers
                    self.run_dir / "transcripts" / f"eval_step{self.step_index:04d}.txt",
                    result.trajectories[:8],
                    self.tokenizer,
                    step=self.step_index,
                )
        self.metrics.log(metrics, step=self.step_index)
        return _broadcast(metrics) if self.world > 1 else metrics

    def _gather(self, local: list[Trajectory], tasks_per_step: int) -> list[Trajectory]:
        """All engines' trajectories in global task-major order, group id = global task index.

        Engine ``e`` (led by rank ``players[e]``) played tasks ``e, e + engines, ...`` of
        the round, ``n`` samples each; the other ranks played none.
        """
        n = self.config.rollout.n
        shares = [local]
        if self.world > 1:
            import torch.distributed as dist

            shares = [None] * self.world
            dist.all_gather_object(shares, local)
        engines = len(self.players)
        trajectories = []
        for task in range(tasks_per_step):
            rank, k = self.players[task % engines], task // engines
            for trajectory in shares[rank][k * n : (k + 1) * n]:
                trajectory.group_id = task
                trajectories.append(trajectory)
        return trajectories

    def _play(self, tasks: Sequence[str], round_: int) -> list[Trajectory]:
        """Play engine ``e``'s tasks ``e, e + engines, ...`` (if this rank leads engine
        ``e``), then gather every engine's trajectories."""
        cfg = self.config
        local: list[Trajectory] = []
        engine = self.placement.engine
        if engine is not None:
            local = run_sync(
                collect(
                    self.engine,
                    self.train_env,
                    list(tasks[engine :: len(self.players)]),
                    n_samples=cfg.rollout.n,
                    sampling=self._sampling(),
                    seed=cfg.seed * 100_003 + self.step_index * 1_009 + engine + round_ * 7_919,
                    mode=cfg.rollout.mode,
                    max_context=cfg.rollout.max_context,
                ),
                method="Trainer.rollout",
                async_method="vt_train.rollout.collect",
            )
        trajectories = self._gather(local, len(tasks))
        self._shape(trajectories)
        return trajectories

    def rollout(self) -> list[Trajectory]:
        """Play this step's tasks (this rank's share) and gather every rank's trajectories.

        With dynamic sampling (``filter_groups``), further rounds of fresh
        tasks are played until ``tasks_per_step`` groups have differing
        rewards (at most ``rollout.max_sampling_rounds`` rounds); the result
        then holds those groups only (and fewer if the rounds ran out; if none
        differ, the first round's trajectories, which :meth:`learn` logs but
        does not train on).
        """
        cfg = self.config
        trajectories = first = self._play(self._sample_tasks(self.step_index), 0)
        if not self.algo.filter_groups:
            return trajectories
        n, target = cfg.rollout.n, cfg.rollout.tasks_per_step
        kept: list[list[Trajectory]] = []
        played = list(first)
        self.sampling_rounds = 1
        while True:
            for g in range(len(trajectories) // n):
                group = trajectories[g * n : (g + 1) * n]
                if len({t.reward for t in group}) > 1 and len(kept) < target:
                    kept.append(group)
            if len(kept) >= target or self.sampling_rounds >= cfg.rollout.max_sampling_rounds:
                break
            trajectories = self._play(
                self._sample_tasks(self.step_index, self.sampling_rounds), self.sampling_rounds
            )
            played += trajectories
            self.sampling_rounds += 1
        if not kept:
            self._played = (first, played)
            return first
        for group_id, group in enumerate(kept):
            for trajectory in group:
                trajectory.group_id = group_id
        result = [t for group in kept for t in group]
        self._played = (result, played)
        return result

    def _shape(self, trajectories: Sequence[Trajectory]) -> None:
        """Truncation rule and overlong punishment (vt_train.algorithms.shaping), once per
        trajectory: as it is played, so dynamic sampling filters on shaped rewards."""
        r = self.config.rollout
        shape_rewards(
            trajectories,
            truncated=r.truncated,
            truncation_penalty=r.truncation_penalty,
            algo=self.algo,
        )
