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
any real update — or, when one update moves the logprobs by less than that,
compare how each side *changed* over the update
(:func:`assert_moved_with_trainer`): a skipped sync leaves the engine where
it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vt_envs.errors import InvalidConfigError, VTError

from .base import RolloutEngine

__all__ = [
    "WeightSyncError",
    "assert_in_sync",
    "assert_moved_with_trainer",
    "compare_logprobs",
    "logprob_agreement",
    "raise_if_apart",
]

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
    return compare_logprobs(ours, theirs, probe_sequences)


def compare_logprobs(
    ours: Sequence[Sequence[float]],
    theirs: Sequence[Sequence[float]],
    probe_sequences: Sequence[Sequence[int]],
) -> dict[str, float]:
    """``{"max_abs_diff", "mean_abs_diff", "num_tokens"}`` between the engine's (``ours``)
    and the trainer's (``theirs``) logprobs of ``probe_sequences`` (t >= 1 each)."""
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


def raise_if_apart(
    metrics: dict[str, float],
    engine: RolloutEngine,
    *,
    tol: float = 1e-3,
    mean_tol: float | None = None,
) -> None:
    """Raise :class:`WeightSyncError` if :func:`compare_logprobs`'s ``max_abs_diff >
    tol`` (or, when ``mean_tol`` is given, ``mean_abs_diff > mean_tol``)."""
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
    raise_if_apart(metrics, engine, tol=tol, mean_tol=mean_tol)
    return metrics


def assert_moved_with_trainer(
    engine_before: Sequence[Sequence[float]],
    engine_after: Sequence[Sequence[float]],
    trainer_before: Sequence[Sequence[float]],
    trainer_after: Sequence[Sequence[float]],
    *,
    min_shift: float = 1e-3,
    max_error: float = 0.5,
) -> dict[str, float]:
    """Did the engine's logprobs move as the trainer's did over one update and sync?

    In bf16 an engine and a trainer disagree by ~1e-2 per token on average even in
    sync, which is more than one small update changes: comparing the two after
    the sync cannot tell a skipped sync from a good one. Their *changes* can: each
    side is compared with itself before the update (same kernels, same numerics),
    so ``shift = mean |trainer_after - trainer_before|`` is the update's effect
    and ``error = mean |(engine_after - engine_before) - (trainer_after -
    trainer_before)|`` is how far the engine's change is from it. A skipped sync
    leaves the engine where it was (``error == shift``); a good one moves it
    along (``error`` well below ``shift``).

    Raises :class:`WeightSyncError` if ``shift >= min_shift`` and ``error >
    max_error * shift``. Below ``min_shift`` the update is too small to tell
    (``sync/moved_checked`` is 0). Returns ``{"shift", "error", "checked"}``.
    """
    moves = []
    for eb, ea, tb, ta in zip(
        engine_before, engine_after, trainer_before, trainer_after, strict=True
    ):
        for a, b, c, d in zip(eb, ea, tb, ta, strict=True):
            if all(abs(x) != float("inf") for x in (a, b, c, d)):  # vision ids: -inf everywhere
                moves.append((b - a, d - c))
    if not moves:
        return {"shift": 0.0, "error": 0.0, "checked": 0.0}
    shift = sum(abs(t) for _, t in moves) / len(moves)
    error = sum(abs(e - t) for e, t in moves) / len(moves)
    checked = shift >= min_shift
    if checked and error > max_error * shift:
        raise WeightSyncError(
            f"the rollout engine did not take the update: over the last update the trainer's "
            f"logprobs on {len(moves)} probe tokens moved by {shift:.3g} on average, and the "
            f"engine's moved {error:.3g} away from that (more than {max_error:g} x the shift; "
            "a skipped or stale sync leaves the engine where it was). Check that the engine "
            "received and applied the streamed weights (update_weights)"
        )
    return {"shift": shift, "error": error, "checked": float(checked)}
