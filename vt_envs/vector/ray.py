"""Sub-envs in Ray actors, behind :class:`~vt_envs.vector.ToolVectorEnv`'s API.

``make_vec(env_id, n, backend="ray", actors=A)`` builds ``A`` async Ray actors,
each holding ``n / A`` sub-envs of ``env_id`` (built there, with the same
keywords), and a :class:`ToolVectorEnv` over one :class:`RemoteSubEnv` handle
per sub-env. A handle forwards ``areset``/``astep``/``atruncate`` to its
actor, and answers locally what the rollout loop and trainer read from a
sub-env (tokenizer, image tokens, stop strings, tasks, spaces) from one local
template env, whose tools never open a session. So the batch API, the
per-sub-env async calls and the trainer work unchanged.

Actors are created with an explicit ``max_concurrency`` (their sub-envs plus
a margin: each sub-env has at most one call in flight, so Ray's default of
1,000 slots can never be what limits them, nor be exhausted by them),
``max_restarts`` and no task retries (a step is not idempotent). When an
actor dies (killed, out of memory, a crash in native code), every running
episode of its sub-envs ends at its next or pending call as *truncated*, with
``info["error"]`` naming the actor and its sub-env indices and
``info["truncation"] == "actor_died"``; Ray restarts the actor (fresh
sub-envs) and the next reset of those sub-envs runs on it. Once its restarts
are spent, a reset raises :class:`~vt_envs.errors.SubEnvError`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vt_envs.errors import InvalidConfigError, ResetNeededError

__all__ = ["RemoteSubEnv", "make_ray_vector_env"]

logger = logging.getLogger(__name__)

_CONCURRENCY_MARGIN = 16
#: How long a reset waits for a dead actor's restart before the error reaches the caller.
ACTOR_RESTART_WAIT_S = 60.0


class _EnvActor:
    """The Ray actor: ``count`` sub-envs of ``env_id`` in one process, stepped on its loop.

    ``make`` arrives pickled by reference (``vt_envs.registration.make``): loading it
    imports ``vt_envs`` in the actor's process, which registers the ids."""

    def __init__(
        self, make: Callable[..., Any], env_id: str, kwargs: Mapping[str, Any], count: int
    ):
        self.envs = [make(env_id, **kwargs) for _ in range(count)]

    async def reset(self, j: int, seed: int | None, options: Mapping[str, Any] | None):
        return await self.envs[j].areset(seed=seed, options=options)

    async def step(self, j: int, action: Any):
        return await self.envs[j].astep(action)

    async def truncate(self, j: int, reason: str):
        return await self.envs[j].atruncate(reason)

    async def abandon(self, j: int) -> None:
        await self.envs[j].abandon_episode()

    async def close(self) -> None:
        for env in self.envs:
            await env.aclose()

    def pid(self) -> int:
        return os.getpid()


class RemoteSubEnv:
    """Sub-env ``j`` of a Ray actor, as a :class:`ToolVectorEnv` sub-env.

    ``unwrapped`` is the handle itself; attributes it does not define (the
    tokenizer, ``image_tokens``, ``tasks``...) come from the local template env.
    """

    def __init__(
        self, actor: Any, j: int, indices: Sequence[int], template: Any, name: str, owner: bool
    ):
        self.actor, self.j, self.indices, self.template = actor, j, list(indices), template
        self.name, self.owner = name, owner  # owner: closes the actor (and maybe the template)
        self.observation_space = template.observation_space
        self.action_space = template.action_space
        self.spec = template.spec
        self.render_mode = template.render_mode
        self.closed = False

    @property
    def unwrapped(self) -> RemoteSubEnv:
        return self

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        if name in ("template",):
            raise AttributeError(name)
        return getattr(self.template, name)

    def _died(self, exc: BaseException) -> tuple[dict[str, Any], float, bool, bool, dict]:
        message = (
            f"the Ray actor {self.name} holding sub-envs {self.indices} died "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "its episodes end here and it is being restarted"
        )
        logger.warning(message)
        info = {"error": message, "truncation": "actor_died", "actor_sub_envs": self.indices}
        return self.template.empty_observation(), 0.0, False, True, info

    async def areset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        from ray.exceptions import RayActorError

        deadline, delay = time.monotonic() + ACTOR_RESTART_WAIT_S, 0.05
        while True:
            try:
                return await self.actor.reset.remote(self.j, seed, options)
            except RayActorError:
                # Died between episodes: Ray restarts it, which takes seconds on a loaded
                # machine (ActorUnavailableError meanwhile); a reset is safe to repeat.
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(2 * delay, 1.0)

    async def astep(self, action: Any):
        return await self._in_episode(self.actor.step, action)

    async def atruncate(self, reason: str):
        return await self._in_episode(self.actor.truncate, reason)

    async def _in_episode(self, method: Any, argument: Any):
        """A call that needs the running episode: if the actor died — during the call, or
        before it (Ray then ran it on the restarted actor, whose fresh sub-env has no
        episode) — the episode ends here as ``actor_died``."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return await method.remote(self.j, argument)
        except RayActorError as exc:
            return self._died(exc)
        except RayTaskError as exc:
            if isinstance(exc.as_instanceof_cause(), ResetNeededError):
                return self._died(exc)
            raise

    async def abandon_episode(self) -> None:
        from ray.exceptions import RayActorError

        try:
            await self.actor.abandon.remote(self.j)
        except RayActorError:
            pass

    async def aclose(self) -> None:
        """The actor's first handle closes its sub-envs and ends it; the very first also
        closes the template. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.j != 0:
            return
        import ray
        from ray.exceptions import RayActorError

        try:
            await self.actor.close.remote()
        except RayActorError:
            pass
        ray.kill(self.actor, no_restart=True)
        if self.owner:
            await self.template.aclose()


def _portable_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` as what every actor can load: ``None`` (the default), or its directory."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    inner = getattr(tokenizer, "_tokenizer", None)
    for name in (getattr(tokenizer, "name", None), getattr(tokenizer, "name_or_path", None),
                 getattr(inner, "name_or_path", None)):  # fmt: skip
        if name == "vt-bpe-2048":
            return None
        if isinstance(name, str) and name and os.path.isfile(os.path.join(name, "tokenizer.json")):
            return name
    raise InvalidConfigError(
        f"backend='ray': the actors load the tokenizer themselves, but {tokenizer!r} has no "
        "directory to load it from; pass tokenizer='path/to/tokenizer_dir'"
    )


def make_ray_vector_env(
    make: Callable[..., Any],
    env_id: str,
    num_envs: int,
    *,
    actors: int | None = None,
    max_restarts: int = 3,
    max_concurrency: int | None = None,
    on_error: str = "raise",
    **kwargs: Any,
) -> Any:
    """A :class:`ToolVectorEnv` of ``num_envs`` sub-envs of ``env_id`` in Ray actors.

    ``vt_envs.make_vec(env_id, num_envs, backend="ray")`` calls this.

    Args:
        make: builds one sub-env, ``make(env_id, **kwargs)``: ``vt_envs.make`` (the
            registry is a layer above this module, so it is passed in; Ray sends it
            to the actors by reference).
        actors: how many actors share the sub-envs (default: one per 16 sub-envs).
        max_restarts: how often Ray restarts a dead actor.
        max_concurrency: each actor's concurrent calls (default: its sub-envs + 16).
        **kwargs: the env's keywords (built in every actor, and once locally).

    Ray must be running (``ray.init(...)``) or is started locally with defaults.
    """
    try:
        import ray
    except ImportError as exc:
        raise InvalidConfigError(
            "backend='ray' needs Ray: pip install 'vt-envs[ray]' (or ray>=2.40)"
        ) from exc
    from vt_envs.vector import ToolVectorEnv

    if not isinstance(num_envs, int) or num_envs < 1:
        raise InvalidConfigError(f"num_envs must be an int >= 1, got {num_envs!r}")
    actors = actors or max(1, -(-num_envs // 16))
    if not 1 <= actors <= num_envs:
        raise InvalidConfigError(f"actors must be in [1, num_envs={num_envs}], got {actors}")
    if "tokenizer" in kwargs:  # actors load it themselves: a tokenizer object may not pickle
        kwargs["tokenizer"] = _portable_tokenizer(kwargs["tokenizer"])
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    template = make(env_id, **kwargs)
    sizes = [num_envs // actors + (a < num_envs % actors) for a in range(actors)]
    remote_cls = ray.remote(_EnvActor)
    handles, first = [], 0
    for a, size in enumerate(sizes):
        indices = list(range(first, first + size))
        actor = remote_cls.options(
            num_cpus=0,
            max_restarts=max_restarts,
            max_task_retries=0,
            max_concurrency=max_concurrency or size + _CONCURRENCY_MARGIN,
        ).remote(make, env_id, dict(kwargs), size)
        name = f"#{a}"
        handles += [RemoteSubEnv(actor, j, indices, template, name, owner=a == 0)
                    for j in range(size)]  # fmt: skip
        first += size
    venv = ToolVectorEnv(handles, on_error=on_error)
    venv.ray_actors = [h.actor for h in handles if h.j == 0]
    return venv
