"""Scripted policies and the episode runner that tests, demos and benches share.

An :class:`OraclePolicy` is privileged: at reset it receives the task (with
its gold) and must then solve it *through the env's actions* — calling the
tools and answering from what they return — so a reward of 1.0 proves that
the env, its tools and its verifier fit together.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vt_envs.core.task import Task
from vt_envs.core.wrappers import areset, astep

__all__ = [
    "AnswerAtOncePolicy",
    "EpisodeResult",
    "OraclePolicy",
    "Policy",
    "arun_episode",
    "run_episode",
]


class Policy(abc.ABC):
    """A text policy driven one turn at a time.

    ``reset`` is called with the episode's task after ``env.reset``;
    ``act`` returns the next action text given the latest observation text
    and info.
    """

    def reset(self, task: Task) -> None:
        """Prepare for a new episode of ``task``."""

    @abc.abstractmethod
    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        """Return the action text for this turn."""


class AnswerAtOncePolicy(Policy):
    """The no-tool baseline: answers on the first turn, with ``answer`` (an empty answer
    would not parse as one)."""

    def __init__(self, tag: str = "answer", answer: str = "unknown"):
        self.tag, self.answer = tag, answer

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<{self.tag}>{self.answer}</{self.tag}>"


class OraclePolicy(Policy):
    """A privileged scripted policy that solves its env's tasks through the tools.

    Subclasses read ``self.task`` (set by :meth:`reset`) and ``self.turn``
    (0 on the first action).
    """

    def reset(self, task: Task) -> None:
        self.task = task
        self.turn = 0

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        action = self.next_action(observation, info)
        self.turn += 1
        return action

    @abc.abstractmethod
    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        """The action for turn ``self.turn``."""


@dataclass
class EpisodeResult:
    """The outcome of one episode run by :func:`run_episode`."""

    task_id: str
    reward: float
    terminated: bool
    truncated: bool
    turns: int
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)


def _start(policy: Policy, task: Task, obs: Mapping[str, Any], info: dict) -> EpisodeResult:
    policy.reset(task)
    result = EpisodeResult(info["task_id"], 0.0, False, False, 0)
    _record(result, obs, info)
    return result


def _record(result: EpisodeResult, obs: Mapping[str, Any], info: dict) -> None:
    result.observations.append(obs["text"])
    result.tokens.extend(obs["tokens"].tolist())
    result.infos.append(info)


def _end(result: EpisodeResult, reward: float, terminated: bool, truncated: bool) -> bool:
    if terminated or truncated:
        result.reward, result.terminated, result.truncated = float(reward), terminated, truncated
        result.turns = result.infos[-1]["turn"]
        return True
    return False


async def arun_episode(
    env: Any,
    policy: Policy,
    *,
    seed: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> EpisodeResult:
    """Run one episode of ``policy`` on the VT env ``env`` (async; through its wrappers).

    ``tokens`` collects every observation id in order (actions are text, so
    their ids are not included).
    """
    obs, info = await areset(env, seed=seed, options=options)
    result = _start(policy, env.unwrapped.task, obs, info)
    while True:
        action = policy.act(obs["text"], info)
        result.actions.append(action)
        obs, reward, terminated, truncated, info = await astep(env, action)
        _record(result, obs, info)
        if _end(result, reward, terminated, truncated):
            return result


def run_episode(
    env: Any,
    policy: Policy,
    *,
    seed: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> EpisodeResult:
    """Run one episode of ``policy`` on ``env`` (a ``gym.make`` env or a raw ToolEnv),
    through its public ``reset``/``step`` (so Gymnasium's wrappers see the calls)."""
    obs, info = env.reset(seed=seed, options=options)
    result = _start(policy, env.unwrapped.task, obs, info)
    while True:
        action = policy.act(obs["text"], info)
        result.actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        _record(result, obs, info)
        if _end(result, reward, terminated, truncated):
            return result
