"""The reward of a :class:`~vt_envs.core.env.ToolEnv` episode: the verifier's
score of the final answer (:func:`verify`), plus optional shaping
(:class:`RewardConfig`), broken down by :func:`reward_parts`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from vt_envs.core.episode import Episode
from vt_envs.core.task import Task
from vt_envs.core.tool import Tool
from vt_envs.core.verifier import Score, Verifier
from vt_envs.errors import InvalidConfigError

__all__ = ["RewardConfig", "reward_parts", "verify"]

# The env's logger: these records have always come from vt_envs.core.env.
logger = logging.getLogger("vt_envs.core.env")


@dataclass(frozen=True)
class RewardConfig:
    """Optional reward shaping, added to the verifier's outcome on the final step.

    All terms are off by default (outcome reward only). Each one that applies
    is reported separately in ``info["reward_parts"]``.

    Attributes:
        invalid_action_penalty: subtracted once per action the parser rejected
            (malformed call, unknown tool, no action).
        tool_error_penalty: subtracted once per tool call that failed (error,
            timeout) — ToRL's penalty for non-executable code.
        missing_answer_penalty: subtracted when the episode ends without an
            answer (truncated by a budget).
        max_penalty: cap on the total subtracted (so shaping never dominates
            the outcome), ``None`` for no cap.
    """

    invalid_action_penalty: float = 0.0
    tool_error_penalty: float = 0.0
    missing_answer_penalty: float = 0.0
    max_penalty: float | None = None

    def __post_init__(self) -> None:
        for name in ("invalid_action_penalty", "tool_error_penalty", "missing_answer_penalty"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(
                    f"RewardConfig.{name} is a penalty magnitude and must be >= 0, "
                    f"got {getattr(self, name)}; it is subtracted from the reward."
                )


def reward_parts(cfg: RewardConfig, episode: Episode, score: Score | None) -> dict[str, float]:
    """``info["reward_parts"]``: ``outcome`` (the score, 0 without one) and each penalty
    of ``cfg`` that applies, negative, scaled down together to ``max_penalty``.
    The reward is their sum."""
    parts = {"outcome": float(score.value) if score is not None else 0.0}
    penalties = {
        "invalid_action": cfg.invalid_action_penalty * episode.invalid_actions,
        "tool_error": cfg.tool_error_penalty * episode.tool_errors,
        "missing_answer": cfg.missing_answer_penalty * (score is None),
    }
    total = sum(penalties.values())
    if cfg.max_penalty is not None and total > cfg.max_penalty:
        penalties = {k: v * cfg.max_penalty / total for k, v in penalties.items()}
    parts.update({k: -v for k, v in penalties.items() if v})
    return parts


async def verify(
    verifier: Verifier,
    task: Task,
    answer: str,
    *,
    timeout_s: float | None,
    tools: Mapping[str, Tool],
    sessions: Mapping[str, Any],
) -> Score:
    """``verifier``'s score of ``answer``, under the ``timeout_s`` deadline (overrun: 0,
    with ``parts["timeout"] = 1``).

    The verifier gets the episode's open ``sessions`` with their tools, read-only
    (:data:`~vt_envs.core.verifier.EpisodeTools`). A ``cheap`` one is awaited right
    here, with no deadline; any other runs as its own task under the deadline (its
    default ``averify`` scores in a thread), so a slow one never stalls the other
    episodes on the loop.
    """
    episode_tools = MappingProxyType({n: (tools[n], s) for n, s in sessions.items()})
    if verifier.cheap:
        return await verifier.averify(task, answer, episode_tools)
    running = asyncio.ensure_future(verifier.averify(task, answer, episode_tools))
    try:
        done, _ = await asyncio.wait({running}, timeout=timeout_s)
    except BaseException:
        running.cancel()
        raise
    if not done:
        running.cancel()  # (a thread cannot be stopped; its result is ignored)
        logger.warning("verification overran its %.3g s deadline", timeout_s)
        return Score(0.0, {"timeout": 1.0}, "verification timed out")
    return running.result()
