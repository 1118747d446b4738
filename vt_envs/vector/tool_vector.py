"""ToolVectorEnv: N ToolEnvs stepped concurrently on one event loop.

Two ways to drive it:

- Gymnasium's batch API (``reset``, ``step`` = ``step_async`` + ``step_wait``,
  with ``autoreset_mode`` next-step, same-step or disabled, and
  ``reset(options={"reset_mask": mask})``): every sub-env's ``astep`` runs
  concurrently on the library loop, so the batch takes as long as its slowest
  tool call, not the sum of them.
- Trajectory-level async (what the trainer's rollout collector uses):
  ``await venv.astep_at(i, action)`` advances sub-env ``i`` alone, so a slow
  tool in one trajectory never blocks the others.

Observations are batched as a dict of tuples (``obs["tokens"][i]`` is sub-env
``i``'s ids), since token sequences differ in length. Sub-envs keep their
wrappers (``gym.make`` ones included): every call goes through them.

Failures: an exception in one sub-env never loses the others' results. By
default (``on_error="raise"``) it is re-raised as
:class:`~vt_envs.errors.SubEnvError` naming the sub-env, with every other
sub-env's result attached; ``on_error="truncate"`` instead ends that
sub-env's episode as a truncation with ``info["error"]``. Either way the
failed sub-env is reset before its next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from vt_envs.core.loop import run_sync, submit
from vt_envs.core.wrappers import aclose, areset, astep
from vt_envs.errors import InvalidConfigError, ResetNeededError, SubEnvError
from vt_envs.vector.protocol import check_sub_env

__all__ = ["ON_ERROR", "ToolVectorEnv"]

StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]
ON_ERROR = ("raise", "truncate")


class ToolVectorEnv(VectorEnv):
    """A vector env over ``ToolEnv`` instances with per-sub-env async steps.

    Args:
        envs: the sub-envs (raw or wrapped), or zero-argument callables that build them.
        autoreset_mode: Gymnasium's ``AutoresetMode`` (or its value): ``NEXT_STEP``
            (default: the step after an episode ends resets that sub-env and
            ignores its action), ``SAME_STEP`` (it resets within the step that
            ended it; the final observation and info are in
            ``info["final_obs"]`` / ``info["final_info"]``) or ``DISABLED``
            (reset ended sub-envs yourself with ``options={"reset_mask": ...}``).
        on_error: ``"raise"`` or ``"truncate"`` (see the module docstring).
    """

    def __init__(
        self,
        envs: Sequence[gym.Env | Callable[[], gym.Env]],
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        on_error: str = "raise",
    ):
        if not envs:
            raise InvalidConfigError("ToolVectorEnv needs at least one sub-env")
        try:
            mode = AutoresetMode(autoreset_mode)
        except ValueError:
            valid = [m.value for m in AutoresetMode]
            raise InvalidConfigError(
                f"autoreset_mode must be one of {valid}, got {autoreset_mode!r}"
            ) from None
        if on_error not in ON_ERROR:
            raise InvalidConfigError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.envs: list[gym.Env] = [
            e() if callable(e) and not isinstance(e, gym.Env) else e for e in envs
        ]
        try:
            for i, env in enumerate(self.envs):
                check_sub_env(env, i)
        except InvalidConfigError:
            for env in self.envs:
                env.close()
            raise
        self.num_envs = len(self.envs)
        self.autoreset_mode = mode
        self.on_error = on_error
        self.metadata = {"render_modes": ["ansi"], "autoreset_mode": mode}
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = first.unwrapped.render_mode
        self.spec = first.spec
        self.stop_strings = first.unwrapped.stop_strings
        self._has_reset = False
        self._episode_over = [True] * self.num_envs  # no running episode in sub-env i
        self._last_obs: list[dict[str, Any] | None] = [None] * self.num_envs
        self._pending: concurrent.futures.Future | None = None

    # ------------------------------------------------- per-sub-env async API

    async def areset_at(
        self, index: int, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset sub-env ``index`` alone."""
        result = await areset(self.envs[index], seed=seed, options=options)
        self._episode_over[index] = False
        self._has_reset = True
        self._last_obs[index] = result[0]
        return result

    async def astep_at(self, index: int, action: Any) -> StepResult:
        """Step sub-env ``index`` alone (no autoreset: call :meth:`areset_at`)."""
        self._require_episode(index)
        try:
            result = await astep(self.envs[index], action)
        except BaseException:
            self._episode_over[index] = True  # whatever state it is in, reset it next
            raise
        self._episode_over[index] = bool(result[2] or result[3])
        self._last_obs[index] = result[0]
        return result

    def _require_episode(self, index: int) -> None:
        if self._episode_over[index]:
            raise ResetNeededError(
                f"sub-env {index} has no running episode; await areset_at({index}) first"
            )

    async def atruncate_at(self, index: int, reason: str) -> StepResult:
        """End sub-env ``index``'s episode as truncated (see ``ToolEnv.atruncate``)."""
        self._require_episode(index)
        result = await self.envs[index].unwrapped.atruncate(reason)
        self._episode_over[index] = True
        self._last_obs[index] = result[0]
        return result

    # ------------------------------------------------------- batch async API

    async def areset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset sub-envs concurrently (int ``seed``: sub-env ``i`` gets ``seed + i``).

        ``options["reset_mask"]`` (a bool array, one per sub-env) resets only
        those sub-envs; the others keep their observation, and ``infos`` holds
        the reset ones only.
        """
        seeds = self._seeds(seed)
        options = dict(options or {})
        mask = self._reset_mask(options.pop("reset_mask", None))
        indices = [i for i in range(self.num_envs) if mask[i]]
        outcomes = await asyncio.gather(
            *(self.areset_at(i, seed=seeds[i], options=options or None) for i in indices),
            return_exceptions=True,
        )
        infos: dict[str, Any] = {}
        for i, outcome in zip(indices, outcomes):
            if isinstance(outcome, BaseException):
                self._episode_over[i] = True
                raise SubEnvError(i, "reset", outcome) from outcome
            infos = self._add_info(infos, outcome[1], i)
        return self._batch(self._last_obs), infos

    async def astep(self, actions: Sequence[Any]) -> tuple[Any, ...]:
        """Step every sub-env concurrently, autoresetting as ``autoreset_mode`` says."""
        if not self._has_reset:
            raise ResetNeededError("step() was called before reset(); call reset() first")
        if len(actions) != self.num_envs:
            raise InvalidConfigError(f"got {len(actions)} actions for {self.num_envs} sub-envs")
        outcomes = await asyncio.gather(
            *(self._step_one(i, a) for i, a in enumerate(actions)), return_exceptions=True
        )
        results: list[StepResult | None] = [None] * self.num_envs
        failures: list[tuple[int, BaseException]] = []
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                failures.append((i, outcome))
                results[i] = await self._failed(i, outcome)
            else:
                results[i] = outcome
        if failures and self.on_error == "raise":
            index, exc = failures[0]
            raise SubEnvError(index, "step", exc, results=results) from exc
        return self._collate(results)

    async def _step_one(self, index: int, action: Any) -> StepResult:
        mode = self.autoreset_mode
        if self._episode_over[index]:
            if mode is AutoresetMode.NEXT_STEP:  # the episode ended last step: reset, ignore action
                obs, info = await self.areset_at(index)
                return obs, 0.0, False, False, info
            if mode is AutoresetMode.DISABLED:
                raise ResetNeededError(
                    f"sub-env {index}'s episode has ended and autoreset is disabled; reset it "
                    "with reset(options={'reset_mask': mask})"
                )
            obs, info = await self.areset_at(index)  # SAME_STEP: never left reset (or failed)
        result = await self.astep_at(index, action)
        if mode is AutoresetMode.SAME_STEP and (result[2] or result[3]):
            obs, reward, terminated, truncated, final_info = result
            reset_obs, reset_info = await self.areset_at(index)
            info = {**reset_info, "final_obs": obs, "final_info": final_info}
            return reset_obs, reward, terminated, truncated, info
        return result

    async def _failed(self, index: int, exc: BaseException) -> StepResult:
        """What a failed sub-env reports: a truncation, after its episode is abandoned."""
        self._episode_over[index] = True
        env = self.envs[index].unwrapped
        await env.abandon_episode()
        obs = env.empty_observation()
        info = {"error": f"{type(exc).__name__}: {exc}", "truncation": "error"}
        self._last_obs[index] = obs
        return obs, 0.0, False, True, info

    # --------------------------------------------------- Gymnasium sync API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self._cancel_pending()
        return run_sync(
            self.areset(seed=seed, options=options), method="reset", async_method="areset"
        )

    def step_async(self, actions: Sequence[Any]) -> None:
        """Start stepping every sub-env; returns at once. Collect with :meth:`step_wait`."""
        if self._pending is not None:
            raise RuntimeError(
                "step_async() called while a step is pending; collect it with step_wait()"
            )
        self._pending = submit(self.astep(actions))

    def step_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the step started by :meth:`step_async`.

        Raises ``TimeoutError`` if it is not done within ``timeout`` seconds;
        the step keeps running, and a later ``step_wait`` returns it.
        """
        if self._pending is None:
            raise RuntimeError("step_wait() called without step_async()")
        done, _ = concurrent.futures.wait([self._pending], timeout=timeout)
        if not done:
            raise TimeoutError(
                f"the vector step did not finish within {timeout} s; it is still running: "
                "call step_wait() again to collect it (reset() or close() cancels it)"
            )
        pending, self._pending = self._pending, None
        return pending.result()

    def step(self, actions: Sequence[Any]) -> tuple[Any, ...]:
        self.step_async(actions)
        return self.step_wait()

    def render(self) -> tuple[str | None, ...]:
        return tuple(env.render() for env in self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call (or read) ``name`` on every sub-env, through its wrappers."""
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return tuple(env.get_wrapper_attr(name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise InvalidConfigError(f"got {len(values)} values for {self.num_envs} sub-envs")
        for env, value in zip(self.envs, values):
            env.set_wrapper_attr(name, value)

    def close_extras(self, **kwargs: Any) -> None:
        self._cancel_pending()
        run_sync(self._close_all(), method="close", async_method="aclose")

    async def aclose(self) -> None:
        await self._close_all()
        self.closed = True

    async def _close_all(self) -> None:
        await asyncio.gather(*(aclose(env) for env in self.envs))

    # ------------------------------------------------------------ batching

    def _cancel_pending(self) -> None:
        """Cancel a step left pending by a timed-out step_wait (its sessions reset)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.cancel():
            concurrent.futures.wait([pending], timeout=30)

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None or isinstance(seed, (int, np.integer)):
            return [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise InvalidConfigError(
                f"got {len(seeds)} seeds for {self.num_envs} sub-envs; pass one per sub-env"
            )
        return seeds

    def _reset_mask(self, mask: Any) -> np.ndarray:
        if mask is None:
            return np.ones(self.num_envs, dtype=np.bool_)
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise InvalidConfigError(
                f"options['reset_mask'] must be a numpy bool array, got {type(mask).__name__}"
                f"{' of ' + str(mask.dtype) if isinstance(mask, np.ndarray) else ''}"
            )
        if mask.shape != (self.num_envs,):
            raise InvalidConfigError(
                f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}"
            )
        if not mask.any():
            raise InvalidConfigError("options['reset_mask'] must select at least one sub-env")
        if not self._has_reset and not mask.all():
            raise ResetNeededError("the first reset() must reset every sub-env (no reset_mask)")
        return mask

    def _batch(self, observations: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
        keys = next(obs for obs in observations if obs is not None).keys()
        return {key: tuple(obs[key] for obs in observations) for key in keys}

    def _add_info(
        self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int
    ) -> dict[str, Any]:
        # A None (``parse`` on reset) is "no value here": the key's mask stays False,
        # so sub-envs that reset and sub-envs that stepped batch into one infos dict.
        present = {k: v for k, v in env_info.items() if v is not None}
        return super()._add_info(vector_infos, present, env_num)

    def _collate(self, results: Sequence[StepResult]) -> tuple[Any, ...]:
        observations = self._batch([r[0] for r in results])
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminated = np.array([r[2] for r in results], dtype=np.bool_)
        truncated = np.array([r[3] for r in results], dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = self._add_info(infos, result[4], i)
        return observations, rewards, terminated, truncated, infos
