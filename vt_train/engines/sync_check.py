"""After a weight sync: does the rollout engine serve the trainer's weights?

A sync can fail silently (a renamed parameter skipped, a reload that read
the previous checkpoint, a worker that kept its old copy); the engine then
samples from a stale policy and every importance ratio is wrong. The check
scores a few probe sequences with the engine (:meth:`RolloutEngine.score`)
and with the trainer's model, and compares the per-token logprobs.

Tolerance: engines that compute in the trainer's dtype agree to ~1e-5
(fp32) — use a tight ``tol``. A bf16 engine against an fp32 trainer differs
by up to ~0.1 on single tokens; compare ``mean_abs_diff`` (``mean_tol``)
there, which stays near 1e-2 while a stale model moves it far more after
any real update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vt_envs.errors import InvalidConfigError, VTError

from .base import RolloutEngine

__all__ = ["WeightSyncError", "assert_in_sync", "logprob_agreement"]

ReferenceFn = Callable[..., Sequence[Sequence[float]]]


class WeightSyncError(VTError, RuntimeError):
    """Raised when the rollout engine's logprobs disagree with the trainer's
    after a weight sync: the engine serves stale (or wrong) weights."""


def logprob_agreement(
    engine: RolloutEngine,
    reference_logprob_fn: ReferenceFn,
    probe_sequences: Sequence[Sequence[int]],
    temperature: float = 1.0,
    *,
    probe_images: Sequence[Sequence[Any]] | None = None,
) -> dict[str, float]:
    """Compare the engine's and the reference's ``log p(token_t | tokens_<t)``.

    Args:
        engine: the rollout engine after ``load_weights``.
        reference_logprob_fn: ``(sequences, temperature) -> per-sequence lists``
            of logprobs for t >= 1 (the trainer's model; same contract as
            :meth:`RolloutEngine.score`).
        probe_sequences: token id sequences of length >= 2.
        temperature: the sampling temperature both sides scale logits by.
        probe_images: each probe's images (a vision-language policy), given to
            both sides: ``engine.score(..., images=)`` and the reference's
            third argument.

    Returns:
        ``{"max_abs_diff", "mean_abs_diff", "num_tokens"}`` over all scored tokens.
    """
    if not probe_sequences or any(len(s) < 2 for s in probe_sequences):
        raise InvalidConfigError(
            "logprob_agreement needs at least one probe sequence, each of length >= 2; got "
            f"lengths {[len(s) for s in probe_sequences]}"
        )
    if probe_images is None:
        ours = engine.score(probe_sequences, temperature)
        theirs = reference_logprob_fn(probe_sequences, temperature)
    else:
        ours = engine.score(probe_sequences, temperature, images=probe_images)
        theirs = reference_logprob_fn(probe_sequences, temperature, probe_images)
    diffs: list[float] = []
    for i, (seq, a, b) in enumerate(zip(probe_sequences, ours, theirs, strict=True)):
        a, b = [float(x) for x in a], [float(x) for x in b]
        if len(a) != len(seq) - 1 or len(b) != len(seq) - 1:
            raise InvalidConfigError(
                f"probe {i} has {len(seq)} tokens, so {len(seq) - 1} logprobs were expected; the "
                f"engine returned {len(a)} and the reference {len(b)}"
            )
        # Equal infinities (a vision token in a probe, impossible on both sides) agree.
        diffs.extend(0.0 if x == y else abs(x - y) for x, y in zip(a, b))
    return {
        "max_abs_diff": max(diffs),
        "mean_abs_diff": sum(diffs) / len(diffs),
        "num_tokens": float(len(diffs)),
    }


def assert_in_sync(
    engine: RolloutEngine,
    reference_logprob_fn: ReferenceFn,
    probe_sequences: Sequence[Sequence[int]],
    temperature: float = 1.0,
    *,
    tol: float = 1e-3,
    mean_tol: float | None = None,
    probe_images: Sequence[Sequence[Any]] | None = None,
) -> dict[str, float]:
    """:func:`logprob_agreement`, raising :class:`WeightSyncError` if
    ``max_abs_diff > tol`` (or, when ``mean_tol`` is given, if
    ``mean_abs_diff > mean_tol`` — then ``tol`` is not used). Returns the
    agreement metrics when in sync."""
    metrics = logprob_agreement(
        engine, reference_logprob_fn, probe_sequences, temperature, probe_images=probe_images
    )
    if mean_tol is not None:
        failed, what, limit = metrics["mean_abs_diff"] > mean_tol, "mean", mean_tol
    else:
        failed, what, limit = metrics["max_abs_diff"] > tol, "max", tol
    if failed:
        raise WeightSyncError(
            f"the rollout engine ({type(engine).__name__}, weights_version="
            f"{engine.weights_version}) serves stale weights: its logprobs on "
            f"{int(metrics['num_tokens'])} probe tokens differ from the trainer's by "
            f"{what} |diff| {metrics[what + '_abs_diff']:.3g} > {limit:.3g} (max "
            f"{metrics['max_abs_diff']:.3g}, mean {metrics['mean_abs_diff']:.3g}). Check that "
            "load_weights received the current state dict with the engine's parameter names, "
            "and that the engine reloaded it (not a cached copy)"
        )
    return metrics
