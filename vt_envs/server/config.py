"""What a ``vt-tool-server`` serves and allows: fixed by its operator, never by a client.

The operator decides everything that touches the host when the server starts
(flags or a config file): which env ids and tools exist, every keyword that
configures them (isolation, sandbox policy, paths, deadlines), which keywords
a client may still choose, and the server's limits. A client only *asks*: it
names a served env id, the keywords on that env's allow-list, a task by id,
and tool arguments. Everything else in a request is refused with a 4xx that
says why (:class:`Refused`).

A config file (YAML, or JSON) looks like::

    envs:
      VT-Math-v0:
        kwargs: {python_timeout_s: 10}        # fixed by the operator
        client_kwargs: [split, difficulty]    # what a client may choose
      VT-SQL-v0: {}                           # the id's defaults
      VT-Lookup-v0: {tools: [lookup]}         # serve only these tools
    limits: {max_sessions: 4096, max_body_bytes: 1048576}

An env without ``client_kwargs`` allows what its registration declares
(:attr:`~vt_envs.registration.EnvRegistration.client_kwargs`: keywords that
only choose which tasks run, such as ``split``). A client keyword that the
operator also fixed is accepted only with the operator's value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vt_envs.errors import InvalidConfigError, did_you_mean

__all__ = ["Limits", "Refused", "ServedEnv", "ServerConfig"]

_MAX_KWARG_STRING = 256
_MAX_KWARG_ITEMS = 64


class Refused(Exception):
    """A request the server will not serve: ``status`` (4xx or 503) and a ``reason``
    that tells the client what was wrong and what it may send instead."""

    def __init__(self, status: int, reason: str, *, retry_after_s: float | None = None):
        super().__init__(reason)
        self.status, self.reason, self.retry_after_s = status, reason, retry_after_s


@dataclass(frozen=True)
class Limits:
    """The server's bounds (per worker process).

    Attributes:
        max_sessions: open sessions in all; past it an open gets 429.
        max_sessions_per_client: open sessions per client address; past it, 429.
        max_inflight: calls running at once; past it a call gets 503 (nothing ran).
        max_body_bytes: the largest request body (413 beyond; checked while reading).
        read_timeout_s: how long a request's headers, and then its body, may take to
            arrive (a connection that sends them slower is closed / answered 408).
        write_timeout_s: how long one write of a reply may wait for the client to read
            (a client that stops reading, e.g. one pipelining requests it never reads
            the answers of, has its connection closed).
        max_connections: open connections; past it uvicorn answers 503.
        max_env_configs: distinct (env id, client keywords) configurations built
            and kept; a request for a new one past it gets 429.
        lease_s: a session's lifetime after its last use.
        shed_lag_s: event-loop lag past which new calls are shed with 503 +
            ``Retry-After`` instead of being queued into their deadlines.
    """

    max_sessions: int = 4096
    max_sessions_per_client: int = 2048
    max_inflight: int = 256
    max_body_bytes: int = 1 << 20
    read_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    max_connections: int = 2048
    max_env_configs: int = 16
    lease_s: float = 300.0
    shed_lag_s: float = 1.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value <= 0:
                raise InvalidConfigError(
                    f"limits.{f.name} must be a finite number > 0, got {value!r}"
                )
            if f.type == "int" and not isinstance(value, int):
                raise InvalidConfigError(f"limits.{f.name} must be an int, got {value!r}")


@dataclass(frozen=True)
class ServedEnv:
    """One env id the server serves.

    Attributes:
        id: the registered env id.
        kwargs: builder keywords fixed by the operator (applied last: a client
            cannot override them).
        client_kwargs: keyword names a client may set.
        tools: the tool names served (``None``: all of the env's tools).
    """

    id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    client_kwargs: frozenset[str] = frozenset()
    tools: frozenset[str] | None = None

    def build_kwargs(self, asked: Any) -> dict[str, Any]:
        """The keywords to build this env with for a client that ``asked`` for these;
        raises :class:`Refused` (403) naming what it may not set and what it may."""
        if asked is None:
            asked = {}
        if not isinstance(asked, Mapping):
            raise Refused(400, f"env_kwargs must be a JSON object, got {type(asked).__name__}")
        allowed = sorted(self.client_kwargs)
        for key, value in asked.items():
            if key in self.kwargs:
                if value != self.kwargs[key]:  # (the operator's value is not echoed)
                    raise Refused(
                        403,
                        f"{self.id}: {key} is fixed by this server's operator; a client may "
                        "not set it to another value (leave it out)",
                    )
                continue
            if key not in self.client_kwargs:
                raise Refused(
                    403,
                    f"{self.id}: {key!r} is not a keyword clients may set on this server "
                    f"(the operator fixes the tools' configuration); clients may set "
                    f"{allowed or 'none'}.{did_you_mean(str(key), allowed)}",
                )
            _check_plain(self.id, key, value)
        return {**asked, **self.kwargs}


def _check_plain(env_id: str, key: str, value: Any) -> None:
    """A client keyword's value: a short string, a finite number, a bool, null, or a
    short list of those (never an object a builder might take as a path or a spec)."""
    items = value if isinstance(value, list) else [value]
    if len(items) > _MAX_KWARG_ITEMS:
        raise Refused(400, f"{env_id}: {key} has {len(items)} items; at most {_MAX_KWARG_ITEMS}")
    for item in items:
        if isinstance(item, str) and len(item) <= _MAX_KWARG_STRING:
            continue
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, (int, float)) and math.isfinite(item):
            continue
        raise Refused(
            400,
            f"{env_id}: {key} must be a short string, a finite number, a bool or null (or a "
            f"list of those), got {item!r:.80}",
        )


@dataclass(frozen=True)
class ServerConfig:
    """Everything the operator fixed (see the module docstring).

    Attributes:
        envs: env id -> :class:`ServedEnv`.
        limits: the server's :class:`Limits`.
    """

    envs: Mapping[str, ServedEnv]
    limits: Limits = field(default_factory=Limits)

    def served(self, env_id: Any) -> ServedEnv:
        """The served env ``env_id``; :class:`Refused` (403) naming the served ones."""
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            known = sorted(self.envs)
            raise Refused(
                403,
                f"this server does not serve env id {env_id!r}; it serves {known}."
                f"{did_you_mean(str(env_id), known)}",
            )
        return env

    @classmethod
    def build(
        cls,
        envs: Mapping[str, Mapping[str, Any]] | Iterable[str] | None = None,
        limits: Mapping[str, Any] | Limits | None = None,
        imports: Iterable[str] = (),
    ) -> ServerConfig:
        """A checked config: ``envs`` maps env ids to ``{kwargs, client_kwargs, tools}``
        (or is a list of ids; ``None``: every registered id whose tools can be remote);
        ``imports`` are modules to import first (they register their own env ids).

        Raises:
            InvalidConfigError: an unknown id or field, an env whose tools cannot be
                served, a fixed keyword that is not JSON, or a bad limit.
        """
        import importlib

        import vt_envs
        from vt_envs.registration import registration_of

        for module in imports:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise InvalidConfigError(
                    f"cannot import {module!r} (named to register env ids): {exc}"
                ) from exc
        if envs is None:
            envs = [i for i, r in vt_envs.registered_envs().items() if r.remote_tools]
        if not isinstance(envs, Mapping):
            envs = {env_id: {} for env_id in envs}
        served = {}
        for env_id, spec in envs.items():
            registration = registration_of(env_id)
            if not registration.remote_tools:
                raise InvalidConfigError(
                    f"{env_id}'s tools cannot be served: its verifier grades the state its "
                    "tools changed (the working copy), which must live beside the env"
                )
            served[registration.id] = _served(registration, spec or {})
        if not served:
            raise InvalidConfigError("a tool server must serve at least one env id")
        if not isinstance(limits, Limits):
            limits = _limits(limits or {})
        return cls(served, limits)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServerConfig:
        """Read a config file (YAML if its name ends in ``.yaml``/``.yml``, else JSON)."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidConfigError(
                f"cannot read the server config {str(path)!r} ({exc.strerror}); give the path "
                "of a YAML or JSON file (see docs: the operator's config)"
            ) from exc
        if str(path).endswith((".yaml", ".yml")):
            try:
                import yaml
            except ImportError as exc:
                raise InvalidConfigError(
                    f"{path} is YAML: install pyyaml (`pip install 'vt-envs[server]'`), or "
                    "write the config as JSON"
                ) from exc
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        if not isinstance(data, Mapping):
            raise InvalidConfigError(f"{path} must hold a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {"envs", "limits", "imports"})
        if unknown:
            raise InvalidConfigError(
                f"{path}: unknown fields {unknown}; a config has envs, limits and imports"
            )
        return cls.build(data.get("envs"), data.get("limits"), data.get("imports") or ())


def _served(registration: Any, spec: Mapping[str, Any]) -> ServedEnv:
    unknown = sorted(set(spec) - {"kwargs", "client_kwargs", "tools"})
    if unknown:
        raise InvalidConfigError(
            f"envs.{registration.id}: unknown fields {unknown}; an env has kwargs, "
            "client_kwargs and tools"
        )
    kwargs = dict(spec.get("kwargs") or {})
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise InvalidConfigError(
            f"envs.{registration.id}.kwargs must be JSON values (paths as strings): {exc}"
        ) from exc
    client = spec.get("client_kwargs")
    client = registration.client_kwargs if client is None else frozenset(client)
    tools = spec.get("tools")
    return ServedEnv(
        registration.id,
        kwargs,
        frozenset(client) - frozenset({"tool_server", "tool_server_token", "tokenizer"}),
        None if tools is None else frozenset(tools),
    )


def _limits(given: Mapping[str, Any]) -> Limits:
    names = [f.name for f in dataclasses.fields(Limits)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InvalidConfigError(
            f"unknown limits {unknown}; limits are {names}.{did_you_mean(unknown[0], names)}"
        )
    return Limits(**given)
