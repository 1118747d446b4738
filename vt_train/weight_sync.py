"""After each update: the actor's weights into the rollout engine, and a check that it
serves them.

:class:`WeightSync` streams the weights (:meth:`DeepSpeedModel.named_weights`
into :meth:`RolloutEngine.update_weights`: neither side holds a second whole
copy of the model) and checks the result on a probe, the step's first two
trajectories:

- the engine's logprobs must agree with the trainer's
  (:func:`~vt_train.engines.sync_check.raise_if_apart`, tolerances by dtype:
  :func:`sync_tolerances`);
- and they must have *moved* with the trainer's over the update
  (:func:`~vt_train.engines.sync_check.assert_moved_with_trainer`): in bf16
  the two sides differ by more than one small update changes a logprob, so
  only this comparison sees a skipped sync.

On several ranks every rank walks the weight stream and runs the trainer's
side of the probe (both are collectives under ZeRO-3); the ranks that lead an
engine compare, and every rank raises the same :class:`WeightSyncError`, so
none is left waiting at a collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vt_train.engines import WeightSyncError, assert_moved_with_trainer
from vt_train.engines.sync_check import compare_logprobs, raise_if_apart
from vt_train.trajectory import Trajectory

__all__ = ["WeightSync", "probe_sequences", "sync_tolerances"]

#: The trainer's and the engine's probe logprobs (the engine's: None without one).
ProbeLogprobs = tuple[list[list[float]], list[list[float]] | None]


def sync_tolerances(config: Any) -> tuple[float, float]:
    """``(mean, max)`` logprob gaps past which a weight sync counts as failed.

    By the training dtype unless the config sets them: an fp32 engine and
    trainer agree to ~1e-5; a bf16 one differs by ~1e-2 on average and ~0.1 on
    single tokens even when in sync, so only a gross gap (stale or wrong
    weights) fails.
    """
    r = config.rollout
    mean, high = (0.1, 2.0) if config.deepspeed.bf16 else (1e-3, 5e-2)
    return (
        mean if r.sync_mean_tol is None else r.sync_mean_tol,
        high if r.sync_max_tol is None else r.sync_max_tol,
    )


def probe_sequences(
    trajectories: Sequence[Trajectory], limit: int, span: tuple[int, int] | None
) -> tuple[list[list[int]], list[list[Any]] | None]:
    """The first two trajectories' first ``limit`` ids as probes, and their images
    (``span``: a vision-language policy's (vision start, vision end) ids; ``None``:
    a text policy, and no images are returned)."""
    probes = [_probe(t, limit, span) for t in trajectories[:2]]
    images = [pictures for _, pictures in probes] if span is not None else None
    return [ids for ids, _ in probes], images


def _probe(
    trajectory: Trajectory, limit: int, span: tuple[int, int] | None
) -> tuple[list[int], list[Any]]:
    """The first ``limit`` ids of ``trajectory`` as a sync probe, with the images whose
    tokens they hold; an image span the cut would split is left out whole."""
    ids = trajectory.input_ids
    if span is None or len(ids) <= limit:
        return ids[:limit], list(trajectory.images)
    cut, complete, opened = limit, 0, None
    for i, token in enumerate(ids[:limit]):
        if token == span[0]:
            opened = i
        elif token == span[1]:
            complete, opened = complete + 1, None
    if opened is not None:
        cut = opened
    return ids[:cut], list(trajectory.images[:complete])


class WeightSync:
    """Pushes the actor's weights into this rank's engine (if it leads one) and checks.

    Each method takes ``engine``: this rank's rollout engine, or ``None``.

    Args:
        actor: the trainer's :class:`~vt_train.ds_engine.DeepSpeedModel`.
        config: the run's :class:`~vt_train.config.TrainConfig`.
        trainer_logprobs: ``(sequences, temperature, images) -> logprobs`` of the
            trainer's model (t >= 1 of each sequence).
        gather: every rank's value of its argument, by rank (the identity's list
            in one process); ``reporter``: the rank whose metrics are returned.
    """

    def __init__(
        self,
        actor: Any,
        config: Any,
        trainer_logprobs: Callable[..., list[list[float]]],
        gather: Callable[[Any], list[Any]],
        reporter: int = 0,
    ):
        self.actor, self.config = actor, config
        self.trainer_logprobs = trainer_logprobs
        self.gather, self.reporter = gather, reporter

    def push(self, engine: Any) -> None:
        """Stream the weights (in the training dtype) into ``engine``; a rank without one
        walks the stream all the same (its gathers are collectives under ZeRO-3)."""
        dtype = torch.bfloat16 if self.config.deepspeed.bf16 else torch.float32
        weights = self.actor.named_weights(dtype)
        if engine is not None:
            engine.update_weights(weights)
        else:
            for _ in weights:
                pass

    def probe(
        self,
        engine: Any,
        sequences: Sequence[Sequence[int]],
        images: Sequence[Sequence[Any]] | None,
    ) -> ProbeLogprobs | None:
        """Both sides' logprobs of the probe at T=1 (the check is about the weights, and
        vLLM scores only at T=1); ``None`` when the check is off."""
        if not self.config.rollout.sync_check or not sequences:
            return None
        trainer = self.trainer_logprobs(sequences, 1.0, images)
        scored = None
        if engine is not None:
            kwargs = {} if images is None else {"images": images}
            scored = engine.score(sequences, 1.0, **kwargs)
        return trainer, scored

    def sync(
        self,
        engine: Any,
        sequences: Sequence[Sequence[int]],
        images: Sequence[Sequence[Any]] | None,
        before: ProbeLogprobs | None,
    ) -> dict[str, float]:
        """:meth:`push`, then the check against ``before`` (:meth:`probe` before the
        update); returns the ``sync/*`` metrics or raises :class:`WeightSyncError`."""
        self.push(engine)
        if before is None:
            return {}
        after = self.probe(engine, sequences, images)
        report: tuple[dict[str, float], str | None] = ({}, None)
        if engine is not None:
            report = self._check(engine, sequences, before, after)
        reports = self.gather(report)
        errors = [error for _, error in reports if error]
        if errors:
            raise WeightSyncError(errors[0])
        return reports[self.reporter][0]

    def _check(
        self, engine: Any, sequences: Sequence[Sequence[int]], before: Any, after: Any
    ) -> tuple[dict[str, float], str | None]:
        """This engine's sync metrics and, if the check failed, why."""
        mean_tol, max_tol = sync_tolerances(self.config)
        (trainer_before, engine_before), (trainer_after, engine_after) = before, after
        metrics: dict[str, float] = {}
        try:
            agreement = compare_logprobs(engine_after, trainer_after, sequences)
            metrics["sync/max_abs_logprob_diff"] = agreement["max_abs_diff"]
            metrics["sync/mean_abs_logprob_diff"] = agreement["mean_abs_diff"]
            raise_if_apart(agreement, engine, tol=max_tol, mean_tol=mean_tol)
            moved = assert_moved_with_trainer(
                engine_before, engine_after, trainer_before, trainer_after,
                min_shift=self.config.rollout.sync_min_shift,
            )  # fmt: skip
            metrics.update({f"sync/{k}": v for k, v in moved.items()})
        except WeightSyncError as error:
            return metrics, str(error)
        return metrics, None
