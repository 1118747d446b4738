"""Held-out evaluation through the same rollout path the trainer uses.

A policy is evaluated by playing greedy (or sampled) episodes on an env's
held-out split with :func:`vt_train.rollout.stream` — the exact code path of
training rollouts, so there is no second generation loop to drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vt_envs.vector import ToolVectorEnv
from vt_train.engines.base import RolloutEngine, SamplingParams
from vt_train.progress import progress_bar
from vt_train.rollout import stream
from vt_train.trajectory import Trajectory

__all__ = ["EvalResult", "domain_metrics", "evaluate", "summarize", "summarize_by_domain"]


@dataclass
class EvalResult:
    """Accuracy and tool statistics of one evaluation.

    ``accuracy`` is the share of episodes whose outcome reward is 1 (the
    verifier's score, without shaping); ``tool_use_rate`` the share with at
    least one tool call.
    """

    accuracy: float
    mean_reward: float
    tool_use_rate: float
    tool_error_rate: float
    invalid_action_rate: float
    mean_turns: float
    mean_generated_tokens: float
    episodes: int
    trajectories: list[Trajectory]
    by_domain: dict[str, dict[str, float]] = field(default_factory=dict)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The summary under ``prefix``; with episodes of several domains (a
        mixture), also each domain's under ``{prefix}{env id}/``."""
        flat = {
            f"{prefix}{k}": getattr(self, k)
            for k in (
                "accuracy",
                "mean_reward",
                "tool_use_rate",
                "tool_error_rate",
                "invalid_action_rate",
                "mean_turns",
                "mean_generated_tokens",
            )
        }
        if len(self.by_domain) > 1:
            flat.update(_flatten(self.by_domain, prefix))
        return flat


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Episode statistics shared by training-rollout metrics and evaluation."""
    n = max(len(trajectories), 1)
    calls = sum(t.tool_calls for t in trajectories)
    return {
        "accuracy": sum(t.reward_parts.get("outcome", 0.0) >= 1.0 for t in trajectories) / n,
        "mean_reward": statistics.fmean(t.reward for t in trajectories) if trajectories else 0.0,
        "tool_use_rate": sum(t.tool_calls > 0 for t in trajectories) / n,
        "tool_error_rate": sum(t.tool_errors for t in trajectories) / max(calls, 1),
        "invalid_action_rate": sum(t.invalid_actions for t in trajectories)
        / max(sum(t.turns for t in trajectories), 1),
        "mean_turns": sum(t.turns for t in trajectories) / n,
        "mean_generated_tokens": sum(t.num_generated for t in trajectories) / n,
    }


def summarize_by_domain(trajectories: Sequence[Trajectory]) -> dict[str, dict[str, float]]:
    """:func:`summarize` per domain (``metadata["env_id"]``), plus each domain's
    ``episodes`` and ``tool_calls`` (per episode); domains in first-seen order."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(str(t.metadata.get("env_id", "")), []).append(t)
    return {
        domain: {
            **summarize(group),
            "episodes": float(len(group)),
            "tool_calls": sum(t.tool_calls for t in group) / len(group),
        }
        for domain, group in groups.items()
    }


def domain_metrics(trajectories: Sequence[Trajectory], prefix: str) -> dict[str, float]:
    """``{prefix}{env id}/{metric}`` for every domain of ``trajectories``."""
    return _flatten(summarize_by_domain(trajectories), prefix)


def _flatten(by_domain: dict[str, dict[str, float]], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}{domain}/{name}": value
        for domain, stats in by_domain.items()
        for name, value in stats.items()
    }


async def evaluate(
    engine: RolloutEngine,
    venv: ToolVectorEnv,
    task_ids: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    max_context: int | None = None,
    progress: bool = False,
    desc: str = "eval",
) -> EvalResult:
    """Play one episode per task id with ``engine`` (greedy by default).

    ``progress``: show a bar (``desc``) counting finished episodes, with the
    running accuracy. Trajectories come back in ``task_ids`` order.
    """
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    trajectories: list[Trajectory] = []
    solved = 0
    bar = progress_bar(desc=desc, total=len(task_ids), unit="ep", enabled=progress, leave=False)
    try:
        async for trajectory in stream(
            engine,
            venv,
            list(task_ids),
            n_samples=1,
            sampling=sampling,
            seed=seed,
            max_context=max_context,
        ):
            trajectories.append(trajectory)
            solved += trajectory.reward_parts.get("outcome", 0.0) >= 1.0
            bar.update(1)
            bar.set_postfix(acc=f"{solved / len(trajectories):.2f}", refresh=False)
    finally:
        bar.close()
    trajectories.sort(key=lambda t: t.metadata["rollout_index"])
    stats: dict[str, Any] = summarize(trajectories)
    return EvalResult(
        **stats,
        episodes=len(trajectories),
        trajectories=trajectories,
        by_domain=summarize_by_domain(trajectories),
    )
