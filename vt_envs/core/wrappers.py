"""VT's async API through Gymnasium's wrappers, without changing Gymnasium's classes.

``gym.make("VT-Math-v0")`` returns the :class:`~vt_envs.core.env.ToolEnv` itself
(VT ids are registered with ``order_enforce=False`` and
``disable_env_checker=True``: the env refuses a step before reset on its own,
and ``vt_envs.check`` runs Gymnasium's checker), so ``await env.astep(...)``
works on it. Once wrappers are around it — ``gym.make(id,
max_episode_steps=N)`` adds ``TimeLimit``, ``disable_env_checker=False`` the
passive checker, a user adds ``RecordEpisodeStatistics`` — the async API is
:func:`areset`, :func:`astep`, :func:`aclose` and :func:`stop_strings` (also
``vt_envs.areset``, ...): each goes *through* the wrappers. A wrapper that
changes ``reset``/``step`` has an *async twin* of its own logic, so awaiting
through it checks and counts exactly as calling through it does; a wrapper
that only forwards is awaited straight through; any other wrapper raises
:class:`~vt_envs.errors.AsyncWrapperError` naming it (register a twin with
:func:`register_async_twin`). Gymnasium's ``Wrapper`` gains no attribute.

One hook remains, scoped to VT envs: :func:`bind_step_limits` (run by ``import
vt_envs``) extends ``TimeLimit.__init__`` to tell the env it wraps its step
limit when that env has ``bind_step_limit`` (a ToolEnv), so the env's own
truncation (sessions closed, ``reward_parts``) lands on the same step; other
envs are untouched. Gymnasium gives an entry point no other way to learn
``gym.make``'s ``max_episode_steps``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium.error import ResetNeeded
from gymnasium.utils.passive_env_checker import (
    env_data_reuse_passive_checker,
    env_reset_passive_checker,
    env_step_passive_checker,
)

from vt_envs.errors import AsyncWrapperError

__all__ = [
    "AsyncTwin",
    "aclose",
    "areset",
    "astep",
    "bind_step_limits",
    "register_async_twin",
    "stop_strings",
]

ResetResult = tuple[Any, dict[str, Any]]
StepResult = tuple[Any, Any, bool, bool, dict[str, Any]]


@dataclass(frozen=True)
class AsyncTwin:
    """The async counterparts of one wrapper class's ``reset`` and ``step``.

    Each is ``async (wrapper, ...) -> result`` and must do what the sync
    method does, awaiting ``vt_envs.areset(wrapper.env, ...)`` /
    ``vt_envs.astep(wrapper.env, action)`` where the sync one calls
    ``wrapper.env.reset`` / ``wrapper.env.step``. ``None``
    means the sync method is Gymnasium's plain forwarding one.
    """

    areset: Callable[..., Awaitable[ResetResult]] | None = None
    astep: Callable[..., Awaitable[StepResult]] | None = None


_TWINS: dict[type, AsyncTwin] = {}


def register_async_twin(wrapper_class: type[gym.Wrapper], twin: AsyncTwin) -> None:
    """Teach ``wrapper_class`` (and its subclasses) the async API."""
    _TWINS[wrapper_class] = twin


def _twin_for(wrapper: gym.Wrapper, method: str) -> Callable[..., Awaitable[Any]] | None:
    """The async twin of ``wrapper``'s ``method`` (``"reset"``/``"step"``), or ``None``
    when the wrapper's sync method is Gymnasium's forwarding one; raises otherwise."""
    for cls in type(wrapper).__mro__:
        if cls is gym.Wrapper:
            return None
        if method in vars(cls):  # the class that defines the sync method decides
            twin = _TWINS.get(cls)
            found = getattr(twin, f"a{method}", None) if twin else None
            if found is None:
                raise AsyncWrapperError(
                    f"{cls.__name__} (wrapping a VT env) overrides {method}() but has no async "
                    f"twin, so `await vt_envs.a{method}(env, ...)` cannot go through it. "
                    "Register one with vt_envs.core.wrappers.register_async_twin, or call the sync "
                    f"{method}()."
                )
            return found
    return None


async def areset(
    env: Any, *, seed: int | None = None, options: Mapping[str, Any] | None = None
) -> ResetResult:
    """``await env.areset(...)`` through whatever Gymnasium wrappers ``env`` has."""
    if isinstance(env, gym.Wrapper):
        twin = _twin_for(env, "reset")
        if twin is not None:
            return await twin(env, seed=seed, options=options)
        return await areset(env.env, seed=seed, options=options)
    return await env.areset(seed=seed, options=options)


async def astep(env: Any, action: Any) -> StepResult:
    """``await env.astep(action)`` through whatever Gymnasium wrappers ``env`` has."""
    if isinstance(env, gym.Wrapper):
        twin = _twin_for(env, "step")
        if twin is not None:
            return await twin(env, action)
        return await astep(env.env, action)
    return await env.astep(action)


async def aclose(env: Any) -> None:
    """Close the VT env under ``env``'s wrappers (their own ``close`` does not run)."""
    await env.unwrapped.aclose()


def stop_strings(env: Any) -> tuple[str, ...]:
    """The stop strings of the VT env under ``env``'s wrappers."""
    return tuple(env.unwrapped.stop_strings)


# ---------------------------------------------------------------- the twins


class _Replay:
    """Stands in for an env whose reset/step already ran, so Gymnasium's own
    passive checks run on the result without calling the env a second time."""

    def __init__(self, env: gym.Env, result: Any):
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self._result = result

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self._result

    def step(self, action: Any) -> Any:
        return self._result


async def _checker_areset(self: Any, *, seed=None, options=None) -> ResetResult:
    result = await areset(self.env, seed=seed, options=options)
    if not self.checked_reset:
        self.checked_reset = True
        self._previous_data = env_reset_passive_checker(_Replay(self.env, result))
    return result


async def _checker_astep(self: Any, action: Any) -> StepResult:
    result = await astep(self.env, action)
    obs, _, _, _, info = result
    if not self.checked_step:
        self.checked_step = True
        env_step_passive_checker(_Replay(self.env, result), action)
        env_data_reuse_passive_checker(self._previous_data, (obs, info), "reset", "step")
        self._previous_data = (obs, info)
    elif not self.checked_data_reuse:
        env_data_reuse_passive_checker(self._previous_data, (obs, info), "step", "step")
        self._previous_data = None
        self.checked_data_reuse = True
    return result


async def _order_areset(self: Any, *, seed=None, options=None) -> ResetResult:
    self._has_reset = True
    return await areset(self.env, seed=seed, options=options)


async def _order_astep(self: Any, action: Any) -> StepResult:
    if not self._has_reset:
        raise ResetNeeded("Cannot call env.step() before calling env.reset()")
    return await astep(self.env, action)


async def _time_limit_areset(self: Any, *, seed=None, options=None) -> ResetResult:
    self._elapsed_steps = 0
    return await areset(self.env, seed=seed, options=options)


async def _time_limit_astep(self: Any, action: Any) -> StepResult:
    obs, reward, terminated, truncated, info = await astep(self.env, action)
    self._elapsed_steps += 1
    if self._elapsed_steps >= self._max_episode_steps:
        truncated = True
    return obs, reward, terminated, truncated, info


async def _statistics_areset(self: Any, *, seed=None, options=None) -> ResetResult:
    result = await areset(self.env, seed=seed, options=options)
    self.episode_start_time = time.perf_counter()
    self.episode_returns = 0.0
    self.episode_lengths = 0
    return result


async def _statistics_astep(self: Any, action: Any) -> StepResult:
    obs, reward, terminated, truncated, info = await astep(self.env, action)
    self.episode_returns += reward
    self.episode_lengths += 1
    if terminated or truncated:
        assert self._stats_key not in info
        elapsed = round(time.perf_counter() - self.episode_start_time, 6)
        info[self._stats_key] = {
            "r": self.episode_returns,
            "l": self.episode_lengths,
            "t": elapsed,
        }
        self.time_queue.append(elapsed)
        self.return_queue.append(self.episode_returns)
        self.length_queue.append(self.episode_lengths)
        self.episode_count += 1
        self.episode_start_time = time.perf_counter()
    return obs, reward, terminated, truncated, info


def _bind_time_limit(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, env: gym.Env, max_episode_steps: int) -> None:
        init(self, env, max_episode_steps)
        bind = getattr(env.unwrapped, "bind_step_limit", None)
        if callable(bind):
            bind(max_episode_steps)

    __init__._vt_binds_step_limit = True  # type: ignore[attr-defined]
    return __init__


register_async_twin(gym.wrappers.PassiveEnvChecker, AsyncTwin(_checker_areset, _checker_astep))
register_async_twin(gym.wrappers.OrderEnforcing, AsyncTwin(_order_areset, _order_astep))
register_async_twin(gym.wrappers.TimeLimit, AsyncTwin(_time_limit_areset, _time_limit_astep))
register_async_twin(
    gym.wrappers.RecordEpisodeStatistics, AsyncTwin(_statistics_areset, _statistics_astep)
)


def bind_step_limits() -> None:
    """Make ``TimeLimit`` tell a VT env it wraps its step limit (idempotent; envs
    without ``bind_step_limit`` are untouched)."""
    time_limit = gym.wrappers.TimeLimit
    if not getattr(time_limit.__init__, "_vt_binds_step_limit", False):
        time_limit.__init__ = _bind_time_limit(time_limit.__init__)
