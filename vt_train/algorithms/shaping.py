"""Reward shaping the trainer applies to a played trajectory, before anything reads it.

Two length-based terms, both off by default:

- **truncation** (``rollout.truncated``): an episode whose budget ran out before
  an answer is kept as it is, masked out of the loss (DAPO's overlong
  filtering; it still counts in its group's baseline), or penalized by a
  constant (``truncation_penalty``);
- **soft overlong punishment** (DAPO, Yu et al. 2025, eq. 13;
  ``AlgorithmConfig.overlong_shaping``): with ``L`` the tokens the policy
  generated in the episode (all its turns; observations are not its
  length), ``L_max = overlong_max_tokens`` and a buffer ``B =
  overlong_buffer``, the reward gets

      0                          if L <= L_max - B
      ((L_max - B) - L) / B      if L_max - B < L <= L_max
      -1                         if L > L_max

  times ``overlong_penalty``: a linear ramp over the last ``B`` tokens, so a
  long correct answer scores less than a short one instead of as much.

Shaping happens once per trajectory, as soon as it is played and before
dynamic sampling looks at its group: a group whose outcomes agree but whose
lengths do not still carries a signal, as in DAPO. What was applied is kept
in ``trajectory.metadata["shaping"]`` (and makes a second call a no-op).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["overlong_penalty", "shape_rewards", "shaping_metrics"]


def overlong_penalty(generated: int, *, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment (module docstring) for ``generated`` tokens."""
    expected = max_tokens - buffer
    if generated <= expected:
        return 0.0
    return factor * max((expected - generated) / buffer, -1.0)


def shape_rewards(
    trajectories: Sequence[Any], *, truncated: str, truncation_penalty: float, algo: Any
) -> None:
    """Apply the truncation rule and the overlong punishment to each trajectory not
    shaped yet (in place: ``reward``, ``loss_mask``; what was applied is recorded in
    ``metadata["shaping"]``)."""
    for t in trajectories:
        if "shaping" in t.metadata:
            continue
        parts: dict[str, float] = {}
        generated = t.num_generated  # before a mask hides it
        if t.truncated and truncated == "mask":
            t.loss_mask = [0] * len(t.loss_mask)
            parts["masked"] = 1.0
        elif t.truncated and truncated == "penalty":
            parts["truncation"] = -truncation_penalty
        if algo.overlong_shaping:
            parts["overlong"] = overlong_penalty(
                generated,
                max_tokens=algo.overlong_max_tokens,
                buffer=algo.overlong_buffer,
                factor=algo.overlong_penalty,
            )
        t.reward += parts.get("truncation", 0.0) + parts.get("overlong", 0.0)
        t.metadata["shaping"] = parts


def shaping_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """``rollout/truncated_share`` and, when the overlong term ran, the share of
    trajectories it penalized and its mean, over ``trajectories``."""
    n = max(len(trajectories), 1)
    metrics = {"rollout/truncated_share": sum(t.truncated for t in trajectories) / n}
    overlong = [t.metadata.get("shaping", {}).get("overlong") for t in trajectories]
    overlong = [v for v in overlong if v is not None]
    if overlong:
        metrics["rollout/overlong_share"] = sum(v < 0 for v in overlong) / n
        metrics["rollout/overlong_penalty_mean"] = sum(overlong) / n
    return metrics
