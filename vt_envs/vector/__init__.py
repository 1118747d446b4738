"""Many envs at once, beside the env kernel (:mod:`vt_envs.core`).

- :class:`ToolVectorEnv` (:mod:`~vt_envs.vector.tool_vector`): N sub-envs
  stepped concurrently on one event loop, with Gymnasium's batch API and a
  per-sub-env async one.
- :class:`MixtureEnv` (:mod:`~vt_envs.vector.mixture`): one sub-env that plays
  tasks drawn by weight from several env ids.
- :func:`make_ray_vector_env` (:mod:`~vt_envs.vector.ray`): sub-envs in Ray
  actors behind the same API.
- :class:`SubEnv` (:mod:`~vt_envs.vector.protocol`): what the three need of each
  env they step, named and checked in one place.
"""

from vt_envs.vector.mixture import (
    MixtureEnv,
    MixturePolicy,
    MixtureTasks,
    check_weights,
    parse_mixture_id,
)
from vt_envs.vector.protocol import SubEnv, check_sub_env
from vt_envs.vector.ray import RemoteSubEnv, make_ray_vector_env
from vt_envs.vector.tool_vector import ON_ERROR, ToolVectorEnv

__all__ = [
    "ON_ERROR",
    "MixtureEnv",
    "MixturePolicy",
    "MixtureTasks",
    "RemoteSubEnv",
    "SubEnv",
    "ToolVectorEnv",
    "check_sub_env",
    "check_weights",
    "make_ray_vector_env",
    "parse_mixture_id",
]
