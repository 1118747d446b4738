"""Registering VT env ids with Gymnasium, with their builders and oracles.

An env id is a *registration*: a builder function that assembles a
:class:`~vt_envs.core.env.ToolEnv` from keyword arguments, plus the oracle
policy that proves the env solvable. ``register_env`` records both and
registers the id with Gymnasium, so ``gym.make(id, **kwargs)`` works.

A builder is made from a declared domain by :func:`domain_builder` (the VT ids'
builders are: :mod:`vt_envs.core.domain`), or is a plain function decorated with
:func:`env_builder` (:mod:`vt_envs.tools.builder`, below the domains that use it;
both re-exported here).
The decorator rejects unknown keywords with :class:`~vt_envs.errors.UnknownKwargError`
(with "did you mean") instead of Python's bare ``TypeError``, and forwards the
keywords ``ToolEnv`` itself understands (``tokenizer``, ``max_turns``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from vt_envs.core.env import ToolEnv
from vt_envs.errors import InvalidConfigError, UnknownNameError
from vt_envs.tools.builder import TOOL_ENV_KWARGS, domain_builder, env_builder
from vt_envs.vector import ToolVectorEnv

__all__ = [
    "TOOL_ENV_KWARGS",
    "EnvRegistration",
    "baseline_for",
    "builder_of",
    "domain_builder",
    "env_builder",
    "make",
    "make_mixture",
    "make_vec",
    "make_vec_mixture",
    "oracle_for",
    "register_env",
    "registered_envs",
    "registration_of",
    "shortcut_for",
]


@dataclass(frozen=True)
class EnvRegistration:
    """What VT knows about one env id.

    Attributes:
        id: the Gymnasium id (``"VT-SQL-v0"``).
        builder: ``"module:function"`` (or the function itself) that returns a
            :class:`ToolEnv`.
        oracle: ``"module:Class"`` of its :class:`~vt_envs.core.policy.OraclePolicy`.
        description: one line for tables and ``--help``.
        baseline: ``"module:Class"`` of a no-tool :class:`~vt_envs.core.policy.Policy`
            (answers without calling a tool); ``None``: ``AnswerAtOncePolicy``.
        kwargs: defaults passed to the builder (overridden by ``gym.make`` kwargs).
        client_kwargs: the builder keywords that only choose *which tasks* run and
            touch nothing on the host (no paths, sandbox settings or resource sizes):
            what a ``vt-tool-server`` lets its clients set unless its operator says
            otherwise (:mod:`vt_envs.server.config`).
        remote_tools: whether the tools can run on a tool server (``False`` when the
            verifier grades the state the tools changed, as VT-SWE-v0's does).
        shortcuts: name -> ``"module:factory"`` of the env's shortcut baselines:
            policies that read only the prompt's surface (or, fitted on the *train*
            split, what its golds usually are) and must stay near chance on the
            held-out split. ``factory(env)`` returns a new
            :class:`~vt_envs.core.policy.Policy` for ``env`` (the env it will play,
            or ``None``); the first name is the env's default shortcut.
    """

    id: str
    builder: str | Callable[..., ToolEnv]
    oracle: str | None
    description: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    baseline: str | None = None
    client_kwargs: frozenset[str] = frozenset({"split"})
    remote_tools: bool = True
    shortcuts: Mapping[str, str | Callable[..., Any]] = field(default_factory=dict)


_REGISTRY: dict[str, EnvRegistration] = {}


def register_env(
    id: str,
    *,
    builder: str | Callable[..., ToolEnv],
    oracle: str | None,
    description: str,
    kwargs: Mapping[str, Any] | None = None,
    baseline: str | None = None,
    client_kwargs: Iterable[str] = ("split",),
    remote_tools: bool = True,
    shortcuts: Mapping[str, str | Callable[..., Any]] | None = None,
) -> EnvRegistration:
    """Register ``id`` with Gymnasium and VT's own table of builders and oracles.

    See :class:`EnvRegistration` for the arguments. Re-registering an id replaces
    it (as Gymnasium does, with its warning).
    """
    if isinstance(client_kwargs, str):
        raise InvalidConfigError(
            f"client_kwargs must be a list of keyword names, got the string {client_kwargs!r}"
        )
    registration = EnvRegistration(
        id,
        builder,
        oracle,
        description,
        dict(kwargs or {}),
        baseline,
        frozenset(client_kwargs),
        remote_tools,
        dict(shortcuts or {}),
    )
    _REGISTRY[id] = registration
    gym.register(
        id=id,
        entry_point=builder,
        vector_entry_point=functools.partial(make_vec, id),
        kwargs=dict(registration.kwargs),
        # The env refuses a step before reset itself and `vt_envs.check` runs Gymnasium's
        # checker: gym.make returns the env, with its async API, unwrapped.
        order_enforce=False,
        disable_env_checker=True,
    )
    return registration


def registered_envs() -> dict[str, EnvRegistration]:
    """All VT env registrations, by id."""
    return dict(_REGISTRY)


def registration_of(env_id: str) -> EnvRegistration:
    """The registration of ``env_id`` (``vt_envs:`` prefix allowed); raises
    :class:`~vt_envs.errors.UnknownNameError` with the known ids."""
    return _lookup(env_id)


def builder_of(env_id: str) -> Callable[..., ToolEnv]:
    """The builder function of ``env_id`` (its ``"module:function"`` imported), as
    :func:`make` calls it; raises :class:`~vt_envs.errors.UnknownNameError` as
    :func:`registration_of` does."""
    return _load(_lookup(env_id).builder)


def _lookup(env_id: str) -> EnvRegistration:
    module, sep, short = env_id.rpartition(":")
    if sep and module:  # "my_pkg.envs:MyOrg/Env-v0", as gym.make reads it
        from vt_envs.core.plugins import import_plugin

        if module != "vt_envs":
            import_plugin(module)
        env_id = short
    if env_id not in _REGISTRY:
        raise UnknownNameError(
            "env id",
            env_id,
            _REGISTRY,
            hint="List them with `vt_envs.registered_envs()`.",
        )
    return _REGISTRY[env_id]


def _load(path: str | Callable[..., Any]) -> Any:
    if callable(path):
        return path
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def make(env_id: str | gym.envs.registration.EnvSpec, **kwargs: Any) -> ToolEnv:
    """Build the raw :class:`ToolEnv` for ``env_id`` (no Gymnasium wrappers).

    ``gym.make`` returns the same env unless asked for wrappers
    (``max_episode_steps=``, ``disable_env_checker=False``); through wrappers the
    async API is ``vt_envs.areset(env, ...)`` / ``vt_envs.astep(env, action)``
    (:mod:`vt_envs.core.wrappers`). ``env_id`` may also be an
    ``EnvSpec`` (``env.spec``): its kwargs are used, updated by ``kwargs``.
    ``env.spec`` carries every keyword the env was built with, so
    ``gym.make(env.spec)`` or ``vt_envs.make(env.spec)`` builds the same env.
    """
    if isinstance(env_id, gym.envs.registration.EnvSpec):
        kwargs = {**env_id.kwargs, **kwargs}
        env_id = env_id.id
    registration = _lookup(env_id)
    built_with = {**registration.kwargs, **kwargs}
    env = builder_of(registration.id)(**built_with)
    env.spec = dataclasses.replace(gym.spec(registration.id), kwargs=built_with)
    return env


def make_vec(
    env_id: str,
    num_envs: int = 1,
    *,
    backend: str = "local",
    ray_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> ToolVectorEnv:
    """Build a :class:`ToolVectorEnv` of ``num_envs`` copies of ``env_id``.

    ``backend="local"``: the sub-envs live in this process. ``"ray"``: in Ray
    actors (:func:`~vt_envs.vector.ray.make_ray_vector_env`;
    ``ray_options``: ``actors``, ``max_restarts``, ``max_concurrency``), behind
    the same API. ``gym.make_vec(env_id, num_envs)`` calls this too (it is the
    ids' vector entry point).
    """
    if not isinstance(num_envs, int) or num_envs < 1:
        raise InvalidConfigError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if backend == "ray":
        from vt_envs.vector.ray import make_ray_vector_env

        return make_ray_vector_env(make, env_id, num_envs, **dict(ray_options or {}), **kwargs)
    if backend != "local":
        raise InvalidConfigError(f"backend must be 'local' or 'ray', got {backend!r}")
    if ray_options:
        raise InvalidConfigError("ray_options= applies to backend='ray' only")
    return ToolVectorEnv([make(env_id, **kwargs) for _ in range(num_envs)])


def make_mixture(
    weights: Mapping[str, float],
    *,
    split: str = "train",
    tokenizer: Any = None,
    env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    size: int | None = None,
    seed: int = 0,
    **shared_kwargs: Any,
) -> Any:
    """One :class:`~vt_envs.vector.mixture.MixtureEnv` over the ids in ``weights``.

    Args:
        weights: env id -> weight (normalized; 0 keeps the env but never draws it).
        split: every member's split.
        tokenizer: one tokenizer for every member (default: VT's).
        env_kwargs: env id -> that member's own ``make`` keywords.
        size: the mixture source's size (default: the members' total).
        seed: seeds which domain each task index draws.
        shared_kwargs: ``make`` keywords for every member (``max_turns``...).
    """
    from vt_envs.core.tokenizer import load_tokenizer
    from vt_envs.vector.mixture import MixtureEnv, MixtureTasks, check_weights

    weights = check_weights(weights)
    per_id = dict(env_kwargs or {})
    unknown = sorted(set(per_id) - set(weights))
    if unknown:
        raise InvalidConfigError(f"env_kwargs names ids {unknown} that are not in the mixture")
    for env_id, kwargs in [("every member", shared_kwargs), *per_id.items()]:
        owned = sorted({"split", "tokenizer"} & set(kwargs))
        if owned:
            raise InvalidConfigError(
                f"{owned} for {env_id} are the mixture's own (one split, one tokenizer for "
                "all members): pass them to make_mixture / make_vec_mixture directly"
            )
    tok = load_tokenizer(tokenizer)
    members: dict[str, Any] = {}
    try:
        for env_id in weights:
            kwargs = {**shared_kwargs, **dict(per_id.get(env_id, {}))}
            members[env_id] = make(env_id, split=split, tokenizer=tok, **kwargs)
        tasks = MixtureTasks(
            {env_id: env.tasks for env_id, env in members.items()},
            weights,
            size=size,
            seed=seed,
            split=split,
        )
        return MixtureEnv(members, tasks)
    except BaseException:
        for env in members.values():
            env.close()
        raise


def make_vec_mixture(
    weights: Mapping[str, float], num_envs: int = 1, **kwargs: Any
) -> ToolVectorEnv:
    """A :class:`ToolVectorEnv` of ``num_envs`` :func:`make_mixture` sub-envs: each can
    run an episode of any id in ``weights``; tasks drawn by weight with the seed."""
    if not isinstance(num_envs, int) or num_envs < 1:
        raise InvalidConfigError(f"num_envs must be an int >= 1, got {num_envs!r}")
    return ToolVectorEnv([make_mixture(weights, **kwargs) for _ in range(num_envs)])


def baseline_for(env_id: str, env: Any = None) -> Any:
    """A new no-tool baseline policy for ``env_id``: its registered one, else one that
    answers at once with ``unknown`` in ``env``'s answer tag (``<answer>unknown</answer>``)."""
    from vt_envs.core.policy import AnswerAtOncePolicy

    registration = _lookup(env_id)
    if registration.baseline is not None:
        return _load(registration.baseline)()
    tag = getattr(getattr(env, "unwrapped", env), "answer_tag", "answer")
    return AnswerAtOncePolicy(tag)


def shortcut_for(env_id: str, name: str | None = None, env: Any = None) -> Any:
    """A new shortcut baseline policy for ``env_id``: the registered one called
    ``name`` (``None``: the env's first, its default), built for ``env``.

    Raises:
        UnknownNameError: ``env_id`` registers no shortcut, or none called ``name``.
    """
    registration = _lookup(env_id)
    names = list(registration.shortcuts)
    if name is None and names:
        name = names[0]
    if name not in names:
        with_shortcuts = [i for i, r in _REGISTRY.items() if r.shortcuts]
        raise UnknownNameError(
            f"{registration.id} shortcut",
            "(default)" if name is None else name,
            names,
            hint=f"Env ids with shortcuts: {', '.join(with_shortcuts) or '(none)'}.",
        )
    return _load(registration.shortcuts[name])(env)


def oracle_for(env_id: str) -> Any:
    """Return a new instance of the oracle policy registered for ``env_id``."""
    registration = _lookup(env_id)
    if registration.oracle is None:
        raise UnknownNameError(
            "oracle for env id", env_id, [i for i, r in _REGISTRY.items() if r.oracle]
        )
    return _load(registration.oracle)()
