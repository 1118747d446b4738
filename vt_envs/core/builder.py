"""The keywords an env builder accepts, checked before the domain's builder runs.

:func:`~vt_envs.tools.builder.env_builder` wraps a domain's builder with these
checks (and runs its tools on a tool server when asked); they live here, with
:class:`~vt_envs.core.env.ToolEnv`, because what they check is its keywords.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from vt_envs.core.env import ToolEnv
from vt_envs.core.tool import check_timeout
from vt_envs.errors import InvalidConfigError, UnknownKwargError

__all__ = ["SERVER_KWARGS", "TOOL_ENV_KWARGS", "accepted_kwargs", "check_kwargs"]

#: Keywords every env id accepts, forwarded to :class:`ToolEnv`.
TOOL_ENV_KWARGS: frozenset[str] = frozenset(
    name
    for name, p in inspect.signature(ToolEnv.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
) - {"tools", "tasks", "verifier", "instructions", "name"}

#: Keywords every env id accepts that choose where its tools run (a tool server).
SERVER_KWARGS: frozenset[str] = frozenset({"tool_server", "tool_server_token"})


def accepted_kwargs(
    fn: Callable[..., Any],
    *,
    fixed: Mapping[str, Any],
    renamed: Mapping[str, str],
    derived: Mapping[str, str],
) -> frozenset[str]:
    """The keywords the builder ``fn`` accepts (``SERVER_KWARGS`` aside): its own, the
    :data:`TOOL_ENV_KWARGS` if it ends with ``**env_kwargs``, and the common keywords it
    sets itself, renames or derives (see :func:`~vt_envs.tools.builder.env_builder`)."""
    params = inspect.signature(fn).parameters
    own = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = own | (TOOL_ENV_KWARGS if forwards else set()) | set(fixed) | set(renamed)
    return frozenset(accepted | set(derived))


def check_kwargs(
    where: str,
    kwargs: Mapping[str, Any],
    accepted: frozenset[str],
    *,
    fixed: Mapping[str, tuple[Any, str]],
    renamed: Mapping[str, str],
    derived: Mapping[str, str],
) -> dict[str, Any]:
    """``kwargs`` (without ``SERVER_KWARGS``) checked for the builder ``where``, as it
    takes them: the keywords it sets itself dropped, common ones renamed to its own names.

    Raises:
        UnknownKwargError: a keyword not in ``accepted`` (with "did you mean").
        InvalidConfigError: a bad deadline, a derived keyword, a fixed one with another
            value, or a common keyword given under both names.
    """
    for key in kwargs:
        if key not in accepted:
            raise UnknownKwargError(where, key, accepted)
        deadline = key.endswith("timeout_s") or key == "max_episode_seconds"
        if deadline and kwargs[key] is not None:  # (None: the builder says if it may be)
            check_timeout(key, kwargs[key], optional=key == "max_episode_seconds")
    for key in derived.keys() & kwargs.keys():
        raise InvalidConfigError(
            f"{where} computes {key} from {derived[key]}; set that instead of {key}"
        )
    kwargs = dict(kwargs)
    for key, (value, why) in fixed.items():
        if key in kwargs and kwargs.pop(key) != value:
            raise InvalidConfigError(
                f"{where} sets {key}={value!r} itself ({why}); leave {key} out or pass {value!r}"
            )
    for common, own in renamed.items():
        if common in kwargs:
            if own in kwargs:
                raise InvalidConfigError(
                    f"{where}: {common} and {own} are the same setting here; pass one "
                    f"(given {common}={kwargs[common]!r}, {own}={kwargs[own]!r})"
                )
            kwargs[own] = kwargs.pop(common)
    return kwargs
