"""The state of a running :class:`~vt_envs.core.env.ToolEnv` episode: its
counters and messages (:class:`Episode`), its open tool sessions
(:class:`OpenSessions`), and the budgets that end it (:func:`budget_exhausted`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vt_envs.core.loop import library_loop, on_library_loop, submit
from vt_envs.core.task import Task
from vt_envs.core.tool import Tool
from vt_envs.errors import InvalidConfigError

__all__ = [
    "Episode",
    "OpenSessions",
    "budget_exhausted",
    "check_budgets",
    "release_abandoned",
    "tool_calls_left",
    "turn_limit",
]

# The env's logger: these records have always come from vt_envs.core.env.
logger = logging.getLogger("vt_envs.core.env")

#: How long a cancelled reset waits for half-opened sessions before closing them.
OPEN_UNWIND_S = 15.0


@dataclass
class Episode:
    """Mutable state of the running episode."""

    task: Task
    started: float
    tokens: int
    messages: list[dict[str, Any]]
    # The episode's images in order (the task's, then each tool result's), by reference.
    images: list[np.ndarray] = field(default_factory=list)
    image_tokens: int = 0
    # One lock per tool whose session takes one call at a time.
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # Tools whose session could not be recovered after a cancelled call.
    broken: set[str] = field(default_factory=set)
    turn: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    invalid_actions: int = 0
    done: bool = False


class OpenSessions:
    """The sessions of the running episode, held apart from the env so that a
    finalizer can close them when the env is dropped without ``close()``.

    ``sessions`` maps a tool's name to its open session; it is ``{}`` between
    episodes, and is replaced (never mutated) by :meth:`open` and :meth:`aclose`.
    """

    def __init__(self, tools: Mapping[str, Tool], verifier: Any = None):
        self.tools, self.verifier = tools, verifier
        self.sessions: dict[str, Any] = {}

    async def open(self, task: Task, seed: int) -> None:
        """Open every tool's session for ``task`` into :attr:`sessions`; on a failure
        or a cancellation, close the ones already opened (and raise), leaving
        :attr:`sessions` as it was."""
        self.sessions = await self._open_all(task, seed)

    async def _open_all(self, task: Task, seed: int) -> dict[str, Any]:
        if len(self.tools) == 1:  # nothing to overlap: no task, no extra loop iteration
            ((name, tool),) = self.tools.items()
            return {name: await tool.open_session(task, seed=seed)}
        opening = {
            name: asyncio.ensure_future(tool.open_session(task, seed=seed))
            for name, tool in self.tools.items()
        }
        try:
            if opening:
                await asyncio.wait(opening.values())
        except BaseException:  # the reset was cancelled: no sandbox may outlive it
            for pending in opening.values():
                pending.cancel()
            await asyncio.wait(opening.values(), timeout=OPEN_UNWIND_S)
            await self._close_opened(opening)
            raise
        failures = [t.exception() for t in opening.values() if t.exception() is not None]
        if failures:
            await self._close_opened(opening)
            raise failures[0]
        return {name: opened.result() for name, opened in opening.items()}

    async def _close_opened(self, opening: Mapping[str, asyncio.Future]) -> None:
        closing = OpenSessions(self.tools)
        closing.sessions = {
            name: t.result()
            for name, t in opening.items()
            if t.done() and not t.cancelled() and t.exception() is None
        }
        await closing.aclose()

    async def aclose(self) -> None:
        """Close the open sessions (a failure is logged, never raised)."""
        sessions, self.sessions = self.sessions, {}
        if not sessions:
            return
        if len(sessions) == 1:  # nothing to overlap: no task, no extra loop iteration
            ((name, session),) = sessions.items()
            try:
                await self.tools[name].close_session(session)
            except Exception as exc:
                logger.warning("closing the %s session failed: %r", name, exc)
            return
        results = await asyncio.gather(
            *(self.tools[n].close_session(s) for n, s in sessions.items()),
            return_exceptions=True,
        )
        for name, result in zip(sessions, results):
            if isinstance(result, BaseException):
                logger.warning("closing the %s session failed: %r", name, result)

    async def aclose_all(self) -> None:
        """Close the open sessions, then the tools and the verifier themselves."""
        await self.aclose()
        closers = [tool.aclose() for tool in self.tools.values()]
        if self.verifier is not None:
            closers.append(self.verifier.aclose())
        await asyncio.gather(*closers)


# Tasks started by finalizers that ran on the loop thread (kept alive until done).
_FINALIZING: set[asyncio.Task] = set()


def release_abandoned(live: OpenSessions) -> None:
    """Finalizer of a ToolEnv dropped without ``close()``: close what it left open."""
    try:
        if on_library_loop():  # cannot block here: schedule it
            task = library_loop().create_task(live.aclose_all())
            _FINALIZING.add(task)
            task.add_done_callback(_FINALIZING.discard)
        else:
            submit(live.aclose_all()).result(timeout=30)
    except Exception as exc:  # interpreter shutdown; the sandboxes die with the process
        logger.debug("finalizing an abandoned env failed: %r", exc)


# ------------------------------------------------------------------ budgets


def check_budgets(
    *,
    max_turns: int,
    max_calls_per_turn: int,
    max_episode_tokens: int,
    max_observation_tokens: int,
    max_tool_calls: int | None,
) -> None:
    """Refuse (:class:`~vt_envs.errors.InvalidConfigError`) a count budget that is not
    an int >= 1, or a ``max_tool_calls`` below 0 (``None``: no cap)."""
    for field_name, value in (
        ("max_turns", max_turns),
        ("max_calls_per_turn", max_calls_per_turn),
        ("max_episode_tokens", max_episode_tokens),
        ("max_observation_tokens", max_observation_tokens),
    ):
        if not isinstance(value, int) or value < 1:
            raise InvalidConfigError(f"{field_name} must be an int >= 1, got {value!r}")
    if max_tool_calls is not None and max_tool_calls < 0:
        raise InvalidConfigError(f"max_tool_calls must be >= 0 or None, got {max_tool_calls}")


def turn_limit(max_turns: int, step_limit: int | None) -> int:
    """The actions an episode may take: ``max_turns``, or Gymnasium's
    ``max_episode_steps`` (``step_limit``) when that is lower."""
    if step_limit is None:
        return max_turns
    return min(max_turns, step_limit)


def budget_exhausted(
    episode: Episode,
    *,
    max_turns: int,
    step_limit: int | None,
    max_episode_tokens: int,
    max_episode_seconds: float | None,
) -> str | None:
    """The first budget ``episode`` has used up, as ``info["truncation"]`` names it
    (``max_turns``, ``max_episode_steps``, ``max_episode_tokens``,
    ``max_episode_seconds``), or ``None`` while every one has room."""
    if episode.turn >= max_turns:
        return "max_turns"
    if step_limit is not None and episode.turn >= step_limit:
        return "max_episode_steps"
    if episode.tokens >= max_episode_tokens:
        return "max_episode_tokens"
    if (
        max_episode_seconds is not None
        and time.monotonic() - episode.started >= max_episode_seconds
    ):
        return "max_episode_seconds"
    return None


def tool_calls_left(episode: Episode, max_tool_calls: int | None) -> int:
    """The tool calls ``episode`` may still run (a huge number when uncapped)."""
    if max_tool_calls is None:
        return 1 << 30
    return max_tool_calls - episode.tool_calls
