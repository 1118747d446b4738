"""Mixed-domain envs: one sub-env that can run an episode of any of several env ids.

``vt_envs.make_vec_mixture({"VT-Math-v0": 0.4, "VT-SQL-v0": 0.3, "VT-Search-v0": 0.3}, 8)``
builds a vector env whose every sub-env is a :class:`MixtureEnv`: it holds
one env of each listed id (all on one tokenizer) and runs each episode in
the member its task belongs to. Tasks come from a :class:`MixtureTasks`
source, which draws each index's domain by weight with the seed; a trainer
that samples indices uniformly (as ``vt_train`` does) therefore trains on
the domains in the given proportions.

Task ids are the member's ids prefixed with the env id
(``"VT-SQL-v0/sql/shop/train/3"``), so an id routes back to its member;
``task.metadata["env_id"]`` and every ``info["env_id"]`` name the domain,
which per-domain metrics group by. Stop strings are the union of the
members'; observations have the same keys in every domain (an image-less
member's observations get an empty ``images`` tuple when another member
has images).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from vt_envs.core.loop import run_sync
from vt_envs.core.policy import Policy
from vt_envs.core.task import Task, TaskSource
from vt_envs.core.wrappers import areset, astep
from vt_envs.errors import InvalidConfigError, UnknownTaskError

__all__ = [
    "MIXTURE_PREFIX",
    "MixtureEnv",
    "MixturePolicy",
    "MixtureTasks",
    "check_weights",
    "parse_mixture_id",
]

#: How a mixture is named where an env id is expected (``vt-bench eval``).
MIXTURE_PREFIX = "mixture:"


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` normalized to sum to 1, or a typed error (empty, negative, all zero)."""
    if not isinstance(weights, Mapping) or not weights:
        raise InvalidConfigError(
            f"a mixture needs a mapping env id -> weight, got {weights!r} "
            '(e.g. {"VT-Math-v0": 0.5, "VT-SQL-v0": 0.5})'
        )
    bad = {
        k: v
        for k, v in weights.items()
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
    }
    if bad:
        raise InvalidConfigError(f"mixture weights must be finite numbers >= 0, got {bad}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise InvalidConfigError(f"mixture weights must not all be 0, got {dict(weights)}")
    return {env_id: float(w) / total for env_id, w in weights.items()}


def parse_mixture_id(spec: str) -> dict[str, float] | None:
    """``"mixture:VT-Math-v0=0.4,VT-SQL-v0=0.6"`` -> its weights; ``None`` for a plain id.

    A weight may be left out (``mixture:VT-Math-v0,VT-SQL-v0``: equal weights).
    """
    if not spec.startswith(MIXTURE_PREFIX):
        return None
    weights: dict[str, float] = {}
    for part in spec[len(MIXTURE_PREFIX) :].split(","):
        env_id, sep, weight = part.strip().partition("=")
        env_id = env_id.strip()
        if not env_id or env_id in weights:
            raise InvalidConfigError(
                f"{spec!r} names {'an empty' if not env_id else 'a repeated'} env id; write "
                "each id once: mixture:VT-Math-v0=0.4,VT-SQL-v0=0.6"
            )
        try:
            weights[env_id] = float(weight) if sep else 1.0
        except ValueError:
            raise InvalidConfigError(
                f"mixture weight {weight!r} of {env_id!r} is not a number in {spec!r} "
                "(write mixture:VT-Math-v0=0.4,VT-SQL-v0=0.6)"
            ) from None
    return check_weights(weights)


class MixturePolicy(Policy):
    """Plays each episode with the policy of the task's domain (``metadata["env_id"]``).

    ``make_policy(env_id)`` builds one policy per domain (once, on first use):
    ``MixturePolicy(vt_envs.oracle_for)`` is the mixture's oracle.
    """

    def __init__(self, make_policy: Any):
        self.make_policy = make_policy
        self.policies: dict[str, Policy] = {}
        self.current: Policy | None = None

    def reset(self, task: Task) -> None:
        env_id = (task.metadata or {}).get("env_id")
        if env_id is None:
            raise InvalidConfigError(
                f"task {task.id!r} names no domain (metadata['env_id']): not a mixture task"
            )
        if env_id not in self.policies:
            self.policies[env_id] = self.make_policy(env_id)
        self.current = self.policies[env_id]
        self.current.reset(task)

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        assert self.current is not None, "reset() first"
        return self.current.act(observation, info)


class MixtureTasks(TaskSource):
    """Tasks of several sources, each index's source drawn by weight with ``seed``.

    Index ``i``'s domain is the ``i``-th draw of a seeded categorical over
    ``weights``; it is that domain's ``k``-th draw (``k`` counted over indices
    ``< i``) and takes the domain's task ``k mod len``, so a prefix of the
    source holds distinct tasks of each domain as long as the domain has
    them. ``size`` defaults to the members' total size.
    """

    def __init__(
        self,
        sources: Mapping[str, TaskSource],
        weights: Mapping[str, float],
        *,
        size: int | None = None,
        seed: int = 0,
        split: str = "train",
    ):
        self.weights = check_weights(weights)
        missing = sorted(set(self.weights) - set(sources))
        if missing:
            raise InvalidConfigError(f"no task source for mixture ids {missing}")
        self.sources = {env_id: sources[env_id] for env_id in self.weights}
        self.ids_in_order = list(self.weights)
        self.size = size if size is not None else sum(len(s) for s in self.sources.values())
        if self.size < 1:
            raise InvalidConfigError(f"a mixture needs size >= 1, got {self.size}")
        rng = np.random.default_rng([seed, 0x6D6978])  # "mix"
        probs = np.array([self.weights[e] for e in self.ids_in_order])
        self._domain = rng.choice(len(probs), size=self.size, p=probs).astype(np.int32)
        # the k-th draw of a domain: k = how many earlier indices drew it
        self._rank = np.zeros(self.size, dtype=np.int64)
        for d in range(len(probs)):
            where = np.flatnonzero(self._domain == d)
            self._rank[where] = np.arange(len(where))
        self.name, self.split = "mixture", split

    def __len__(self) -> int:
        return self.size

    def locate(self, index: int) -> tuple[str, int]:
        """``(env_id, index in that env's source)`` of mixture index ``index``."""
        env_id = self.ids_in_order[int(self._domain[index])]
        return env_id, int(self._rank[index]) % len(self.sources[env_id])

    def _load(self, index: int) -> Task:
        env_id, inner = self.locate(index)
        return self._wrap(env_id, self.sources[env_id][inner])

    @staticmethod
    def _wrap(env_id: str, task: Task) -> Task:
        return dataclasses.replace(
            task, id=f"{env_id}/{task.id}", metadata={**task.metadata, "env_id": env_id}
        )

    def get(self, task_id: str) -> Task:
        """The task with mixture id ``"ENV-ID/inner id"`` (any task of a member's source)."""
        env_id, sep, inner = str(task_id).partition("/")
        if not sep or env_id not in self.sources:
            raise UnknownTaskError(task_id, self.name, list(self.sources)[:5])
        return self._wrap(env_id, self.sources[env_id].get(inner))

    def counts(self, n: int | None = None) -> dict[str, int]:
        """How many of the first ``n`` indices (default: all) each domain drew."""
        drawn = np.bincount(
            self._domain[: self.size if n is None else n], minlength=len(self.weights)
        )
        return {env_id: int(c) for env_id, c in zip(self.ids_in_order, drawn)}


class MixtureEnv(gym.Env):
    """Runs each episode in the member env its task belongs to.

    Args:
        members: env id -> env (raw ``ToolEnv`` or wrapped), all on one tokenizer.
        tasks: the :class:`MixtureTasks` over the members' sources.

    ``reset`` takes ``options={"task_id": ...}`` (a mixture id),
    ``{"task": Task}`` (a mixture task, or any task whose
    ``metadata["env_id"]`` names a member), or draws the next task with the
    seeded RNG. The API is :class:`~vt_envs.core.env.ToolEnv`'s (sync and
    async ``reset``/``step``, ``atruncate``, ``render``, ``close``).
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, members: Mapping[str, gym.Env], tasks: MixtureTasks):
        if set(members) != set(tasks.sources):
            raise InvalidConfigError(
                f"members {sorted(members)} and task sources {sorted(tasks.sources)} differ"
            )
        self.members = dict(members)
        self.tasks = tasks
        raw = {env_id: env.unwrapped for env_id, env in self.members.items()}
        first_id, first = next(iter(raw.items()))
        for env_id, env in raw.items():
            if env.tokenizer.vocab_size != first.tokenizer.vocab_size or (
                type(env.tokenizer) is not type(first.tokenizer)
            ):
                raise InvalidConfigError(
                    f"mixture members must share one tokenizer: {first_id} and {env_id} differ; "
                    "pass tokenizer= once to make_vec_mixture"
                )
        self.tokenizer = first.tokenizer
        self.name = "mixture(" + ", ".join(raw) + ")"
        self.stop_strings = tuple(
            dict.fromkeys(s for env in raw.values() for s in env.stop_strings)
        )
        self._with_images = any("images" in env.observation_space.spaces for env in raw.values())
        spaces = dict(first.observation_space.spaces)
        if self._with_images:
            spaces["images"] = next(
                env.observation_space["images"]
                for env in raw.values()
                if "images" in env.observation_space.spaces
            )
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = first.action_space
        modes = {env.render_mode for env in raw.values()}
        self.render_mode = modes.pop() if len(modes) == 1 else None
        common = set.intersection(*(set(env.metadata["render_modes"]) for env in raw.values()))
        self.metadata = {**self.metadata, "render_modes": sorted(common)}
        self._active: str = first_id

    # ------------------------------------------------------------------ API

    @property
    def active_env_id(self) -> str:
        """The env id of the running (or last) episode."""
        return self._active

    @property
    def task(self) -> Task | None:
        """The running episode's task as its member sees it (privileged)."""
        return self.members[self._active].unwrapped.task

    @property
    def image_tokens(self) -> Any:
        return getattr(self.members[self._active].unwrapped, "image_tokens", None)

    async def areset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        if "task" in options:
            task = options.pop("task")
            env_id = (task.metadata or {}).get("env_id") if isinstance(task, Task) else None
            if env_id not in self.members:
                raise InvalidConfigError(
                    f"options['task'] must be a task of this mixture (metadata['env_id'] one of "
                    f"{sorted(self.members)}), got {getattr(task, 'id', task)!r}"
                )
        elif "task_id" in options:
            task = self.tasks.get(str(options.pop("task_id")))
            env_id = task.metadata["env_id"]
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
            env_id = task.metadata["env_id"]
        inner = dataclasses.replace(task, id=task.id.removeprefix(f"{env_id}/"))
        if env_id != self._active:  # the last member's episode ends here, as a reset ends it
            await self._abandon_member(self._active)
        self._active = env_id
        member = self.members[env_id]
        obs, info = await areset(member, seed=seed, options={**options, "task": inner})
        return self._observation(obs), self._info(info)

    async def astep(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = await astep(self.members[self._active], action)
        return self._observation(obs), reward, terminated, truncated, self._info(info)

    async def atruncate(
        self, reason: str
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        result = await self.members[self._active].unwrapped.atruncate(reason)
        obs, reward, terminated, truncated, info = result
        return self._observation(obs), reward, terminated, truncated, self._info(info)

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return run_sync(
            self.areset(seed=seed, options=options), method="reset", async_method="areset"
        )

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return run_sync(self.astep(action), method="step", async_method="astep")

    async def abandon_episode(self) -> None:
        """End the running episode without a result (a vector env does this to a
        sub-env whose step raised): the active member closes its sessions."""
        await self._abandon_member(self._active)

    async def _abandon_member(self, env_id: str) -> None:
        await self.members[env_id].unwrapped.abandon_episode()

    def render(self) -> Any:
        return self.members[self._active].render()

    def empty_observation(self) -> dict[str, Any]:
        return self._observation(self.members[self._active].unwrapped.empty_observation())

    async def aclose(self) -> None:
        for env in self.members.values():
            closer = getattr(env, "aclose", None)
            if closer is not None:
                await closer()
            else:  # pragma: no cover - every VT env has aclose
                env.close()

    def close(self) -> None:
        run_sync(self.aclose(), method="close", async_method="aclose")

    def __repr__(self) -> str:
        return f"<MixtureEnv {self.tasks.weights} size={len(self.tasks)}>"

    __str__ = __repr__

    # -------------------------------------------------------------- helpers

    def _observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self._with_images and "images" not in obs:
            return {**obs, "images": ()}
        return obs

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        info = dict(info)
        info["env_id"] = self._active
        if "task_id" in info:
            info["task_id"] = f"{self._active}/{info['task_id']}"
        return info
