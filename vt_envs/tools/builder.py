"""``@env_builder``: a domain's builder function, with its keywords checked.

It lives below the domains (which decorate their builders with it) and above
the core (whose :mod:`~vt_envs.core.builder` checks the keywords); it sits with
the tools because ``tool_server=`` swaps the built env's tools for remote ones
(:mod:`vt_envs.tools.remote.client`). ``vt_envs.env_builder`` and
``vt_envs.registration.env_builder`` are this one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from vt_envs.core.builder import SERVER_KWARGS, TOOL_ENV_KWARGS, accepted_kwargs, check_kwargs
from vt_envs.core.domain import Domain, Toolset
from vt_envs.core.env import ToolEnv
from vt_envs.core.keyword_types import check_types, keyword_hints
from vt_envs.errors import InvalidConfigError

__all__ = ["TOOL_ENV_KWARGS", "domain_builder", "env_builder"]


def env_builder(
    fn: Callable[..., ToolEnv] | None = None,
    *,
    fixed: Mapping[str, tuple[Any, str]] | None = None,
    renamed: Mapping[str, str] | None = None,
    derived: Mapping[str, str] | None = None,
) -> Any:
    """Make ``fn`` reject unknown keywords with a typed, helpful error.

    ``fn`` must take keyword-only arguments and may end with ``**env_kwargs``,
    which receives only the :data:`TOOL_ENV_KWARGS` it does not declare itself.
    Every keyword is checked against its annotation (the builder's, else
    ``ToolEnv``'s: :func:`~vt_envs.core.keyword_types.check_types`), so a value of
    the wrong type is refused by name before anything is built. Every keyword that
    names a deadline (``*timeout_s``, ``max_episode_seconds``) is checked by
    :func:`~vt_envs.core.tool.check_timeout` (``None`` passes to
    ``fn``), so a NaN, infinite, zero or negative one is refused under its own
    name, whichever domain's builder it was meant for.

    Used bare (``@env_builder``) or with the common keywords the domain sets
    itself (``@env_builder(fixed=..., renamed=...)``). The built function keeps what it
    accepts as ``accepted_kwargs`` and these rules as ``keyword_rules``
    (``{"fixed": ..., "renamed": ..., "derived": ...}``):

    Args:
        fixed: common keyword -> ``(value, why)``, a :data:`TOOL_ENV_KWARGS` the
            builder passes to ``ToolEnv`` itself. Given the same value it is
            accepted (and dropped); another value raises
            :class:`~vt_envs.errors.InvalidConfigError` saying why.
        renamed: common keyword -> the builder's own name for it
            (``{"max_tool_calls": "max_searches"}``); giving both is refused.
        derived: common keyword -> what the builder computes it from
            (``{"verify_timeout_s": "eval_timeout_s + 30 s"}``); giving it is refused
            with that pointer.
    """
    if fn is None:
        return functools.partial(env_builder, fixed=fixed, renamed=renamed, derived=derived)
    rules = {"fixed": dict(fixed or {}), "renamed": dict(renamed or {}),
             "derived": dict(derived or {})}  # fmt: skip
    accepted = accepted_kwargs(fn, **rules)
    where = f"{fn.__module__}.{fn.__name__}()"

    hints: dict[str, Any] | None = None  # read on first use: annotations name late imports

    def checked(kwargs: dict[str, Any]) -> dict[str, Any]:
        nonlocal hints
        kwargs = check_kwargs(where, kwargs, accepted, **rules)
        if hints is None:  # the builder's own annotations, ToolEnv's for what it forwards
            hints = {**keyword_hints(ToolEnv.__init__), **keyword_hints(fn)}
        check_types(where, kwargs, hints)
        return kwargs

    @functools.wraps(fn)
    def build(**kwargs: Any) -> ToolEnv:
        # tool_server= / tool_server_token= (every env id): its tools run on a tool server.
        server, token = kwargs.pop("tool_server", None), kwargs.pop("tool_server_token", None)
        kwargs = checked(kwargs)
        env = fn(**kwargs)
        if server is not None:
            from vt_envs.tools.remote.client import attach_tool_server

            attach_tool_server(env, server, env_id=env.name, env_kwargs=kwargs, token=token)
        return env

    build.accepted_kwargs = accepted | SERVER_KWARGS  # type: ignore[attr-defined]
    # The rules as data, for the keyword reference (vt_envs.keyword_reference).
    build.keyword_rules = rules  # type: ignore[attr-defined]
    build.check_kwargs = checked  # type: ignore[attr-defined]
    return build


def domain_builder(domain: Domain, *, name: str, module: str | None = None) -> Any:
    """The registered builder of a declared domain: an :func:`env_builder` function
    whose signature, annotations and docstring are the domain's (its config's fields,
    then its episode defaults, then ``**env_kwargs``), so ``gym.make``, the keyword
    checks, ``vt_envs.keywords`` and the keyword reference read it like any other.

    The returned function keeps ``domain`` and has ``toolset(**kwargs)``: the domain's
    tools and task source alone, for these keywords, checked the same way (what a
    tool server builds; ``tool_server=`` is refused there). ``name`` is the function's
    name in messages and ``module`` its module (default: the config's), where the
    domain's package exports it (``"make_sql_env"``, ``"vt_envs.domains.sql"``).
    """

    def build(**kwargs: Any) -> ToolEnv:
        return domain.make(kwargs)

    build.__signature__ = domain.signature()  # type: ignore[attr-defined]
    build.__annotations__ = domain.annotations()
    build.__doc__ = domain.builder_doc()
    build.__module__ = module or domain.config.__module__
    build.__name__ = build.__qualname__ = name
    made = env_builder(build, fixed=domain.fixed, renamed=domain.renamed, derived=domain.derived)

    def toolset(**kwargs: Any) -> Toolset:
        if SERVER_KWARGS & set(kwargs):
            raise InvalidConfigError(
                f"{domain.id}: a tool server's tools run there; "
                f"{sorted(SERVER_KWARGS & set(kwargs))} cannot be given to it"
            )
        return domain.toolset(made.check_kwargs(dict(kwargs)))

    made.domain = domain
    made.toolset = toolset
    return made
