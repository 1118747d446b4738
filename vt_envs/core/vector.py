"""ToolVectorEnv: N ToolEnvs stepped concurrently on one event loop.

Two ways to drive it:

- Gymnasium's batch API (``reset``, ``step`` = ``step_async`` + ``step_wait``,
  next-step autoreset): every sub-env's ``astep`` runs concurrently on the
  library loop, so the batch takes as long as its slowest tool call, not the
  sum of them.
- Trajectory-level async (what the trainer's rollout collector uses):
  ``await venv.astep_at(i, action)`` advances sub-env ``i`` alone, so a slow
  tool in one trajectory never blocks the others.

Observations are batched as a dict of tuples (``obs["tokens"][i]`` is sub-env
``i``'s ids), since token sequences differ in length.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from vt_envs.core.env import ToolEnv
from vt_envs.core.loop import run_sync, submit
from vt_envs.errors import InvalidConfigError, ResetNeededError

__all__ = ["ToolVectorEnv"]

StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]


class ToolVectorEnv(VectorEnv):
    """A vector env over ``ToolEnv`` instances with per-sub-env async steps.

    Args:
        envs: the sub-envs, or zero-argument callables that build them.
    """

    metadata: dict[str, Any] = {
        "render_modes": ["ansi"],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
    }

    def __init__(self, envs: Sequence[ToolEnv | Callable[[], ToolEnv]]):
        if not envs:
            raise InvalidConfigError("ToolVectorEnv needs at least one sub-env")
        built = [e() if callable(e) and not isinstance(e, gym.Env) else e for e in envs]
        self.envs: list[ToolEnv] = [e.unwrapped for e in built]
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = first.render_mode
        self.spec = first.spec
        self.stop_strings = first.stop_strings
        self._needs_reset = [True] * self.num_envs
        self._pending: Future[list[StepResult]] | None = None

    # ------------------------------------------------- per-sub-env async API

    async def areset_at(
        self, index: int, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset sub-env ``index`` alone."""
        result = await self.envs[index].areset(seed=seed, options=options)
        self._needs_reset[index] = False
        return result

    async def astep_at(self, index: int, action: Any) -> StepResult:
        """Step sub-env ``index`` alone (no autoreset: call :meth:`areset_at`)."""
        if self._needs_reset[index]:
            raise ResetNeededError(
                f"sub-env {index} has no running episode; await areset_at({index}) first"
            )
        result = await self.envs[index].astep(action)
        self._needs_reset[index] = result[2] or result[3]
        return result

    # ------------------------------------------------------- batch async API

    async def areset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset every sub-env concurrently (int ``seed``: sub-env ``i`` gets ``seed + i``)."""
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise InvalidConfigError(
                    f"got {len(seeds)} seeds for {self.num_envs} sub-envs; pass one per sub-env"
                )
        results = await asyncio.gather(
            *(self.areset_at(i, seed=s, options=options) for i, s in enumerate(seeds))
        )
        observations = self._batch([obs for obs, _ in results])
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        return observations, infos

    async def astep(self, actions: Sequence[Any]) -> tuple[Any, ...]:
        """Step every sub-env concurrently (next-step autoreset)."""
        if len(actions) != self.num_envs:
            raise InvalidConfigError(f"got {len(actions)} actions for {self.num_envs} sub-envs")
        results = await asyncio.gather(
            *(self._step_or_autoreset(i, a) for i, a in enumerate(actions))
        )
        return self._collate(results)

    async def _step_or_autoreset(self, index: int, action: Any) -> StepResult:
        if self._needs_reset[index]:  # the episode ended last step: reset, ignore the action
            obs, info = await self.areset_at(index)
            return obs, 0.0, False, False, info
        return await self.astep_at(index, action)

    # --------------------------------------------------- Gymnasium sync API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return run_sync(
            self.areset(seed=seed, options=options), method="reset", async_method="areset"
        )

    def step_async(self, actions: Sequence[Any]) -> None:
        """Start stepping every sub-env; returns at once. Collect with :meth:`step_wait`."""
        if self._pending is not None:
            raise RuntimeError("step_async() called twice without step_wait()")
        self._pending = submit(self.astep(actions))

    def step_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the step started by :meth:`step_async`."""
        if self._pending is None:
            raise RuntimeError("step_wait() called without step_async()")
        pending, self._pending = self._pending, None
        return pending.result(timeout)

    def step(self, actions: Sequence[Any]) -> tuple[Any, ...]:
        self.step_async(actions)
        return self.step_wait()

    def render(self) -> tuple[str | None, ...]:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(env.aclose() for env in self.envs))

        run_sync(close_all(), method="close", async_method="aclose")

    async def aclose(self) -> None:
        await asyncio.gather(*(env.aclose() for env in self.envs))
        self.closed = True

    # ------------------------------------------------------------ batching

    def _batch(self, observations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {key: tuple(obs[key] for obs in observations) for key in observations[0]}

    def _collate(self, results: Sequence[StepResult]) -> tuple[Any, ...]:
        observations = self._batch([r[0] for r in results])
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminated = np.array([r[2] for r in results], dtype=np.bool_)
        truncated = np.array([r[3] for r in results], dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = self._add_info(infos, result[4], i)
        return observations, rewards, terminated, truncated, infos
