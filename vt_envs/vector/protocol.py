"""The sub-env protocol: what a vector env needs of each env it steps.

:class:`~vt_envs.vector.ToolVectorEnv` steps sub-envs through their wrappers
(``areset``, ``astep``, ``aclose``) and asks the env under them
(``env.unwrapped``) to end an episode early: truncated for a budget the caller
keeps (``atruncate``), or abandoned after a step raised (``abandon_episode``,
then ``empty_observation`` for what the failed step reports). A
:class:`~vt_envs.core.env.ToolEnv`, a :class:`~vt_envs.vector.MixtureEnv` and a
Ray handle (:class:`~vt_envs.vector.ray.RemoteSubEnv`) are sub-envs; so is any
env that defines these methods. They are checked once, when the vector env is
built, not probed when a step fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from vt_envs.errors import InvalidConfigError

__all__ = ["SUB_ENV_METHODS", "StepResult", "SubEnv", "check_sub_env"]

StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]


@runtime_checkable
class SubEnv(Protocol):
    """The env under a sub-env's wrappers, as a vector env drives it."""

    async def areset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode."""
        ...

    async def astep(self, action: Any) -> StepResult:
        """Take one action."""
        ...

    async def atruncate(self, reason: str) -> StepResult:
        """End the running episode now, truncated for ``reason``; its final step."""
        ...

    async def abandon_episode(self) -> None:
        """End the running episode without a result, releasing its sessions."""
        ...

    def empty_observation(self) -> dict[str, Any]:
        """The observation of a step that produced none (a failed step's)."""
        ...

    async def aclose(self) -> None:
        """Release everything the env holds (idempotent)."""
        ...


#: The methods :class:`SubEnv` names.
SUB_ENV_METHODS = (
    "areset",
    "astep",
    "atruncate",
    "abandon_episode",
    "empty_observation",
    "aclose",
)


def check_sub_env(env: Any, index: int) -> None:
    """Raise :class:`~vt_envs.errors.InvalidConfigError` naming what sub-env ``index``
    (``env.unwrapped``) lacks of :class:`SubEnv`."""
    inner = getattr(env, "unwrapped", env)
    missing = [name for name in SUB_ENV_METHODS if not callable(getattr(inner, name, None))]
    if missing:
        raise InvalidConfigError(
            f"sub-env {index} ({type(inner).__name__}) is not a VT sub-env: it lacks "
            f"{missing}. Give the vector env ToolEnvs (gym.make of a VT id), MixtureEnvs, "
            "or envs that implement vt_envs.vector.protocol.SubEnv"
        )
