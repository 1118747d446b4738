"""Tools: what an agent can call, and the per-episode sessions they keep.

A tool is a class with a ``name``, a ``description``, a JSON-schema
``parameters`` object and an async :meth:`Tool.call`. Per-episode state (a
sandboxed interpreter, a database connection, a working copy of a repo)
lives in a *session* that :meth:`Tool.open_session` creates at reset and
:meth:`Tool.close_session` releases when the episode ends.

The call contract (what :class:`~vt_envs.core.env.ToolEnv` relies on):

- ``call`` never raises for anything the *policy* did (bad code, bad SQL, a
  missing key): it returns ``ToolResult(ok=False, error=...)`` with text the
  agent can read. Exceptions are reserved for bugs and infrastructure
  failures; the env still turns them into observations, but logs them.
- **Deadlines.** The env hands every call its ``timeout_s``: the tool's own
  :attr:`Tool.timeout_s`, cut to what is left of the episode's wall-clock
  budget. The tool enforces it itself (kill and restart its process,
  interrupt its query) and returns a ``"timeout"`` result. The env's timer is
  only a backstop at ``timeout_s + grace_s``: when it fires, the call is
  cancelled, the agent reads a timeout observation, and the env awaits
  :meth:`Tool.recover_session` before the session takes another call.
- **Cancellation.** A call can be cancelled at any await (the backstop,
  ``env.close()``, Ctrl-C on a sync ``step``, a vector ``step_wait`` that gave
  up). Afterwards its session must be reset or closed — never wedged, never
  answering a later call with an earlier call's output.
- **One call at a time.** The env never runs two calls on one session
  concurrently unless the tool sets :attr:`Tool.concurrent_calls`; calls
  from one action run in order.
- **Closed means closed.** A session closed once never restarts; a call on
  it returns a failure.
- Tools are registered under the entry-point group ``vt_envs.tools``
  (``name = "package.module:ToolClass"``), so a third-party package can add
  tools that ``tool_registry.create(name)`` finds.
"""

from __future__ import annotations

import abc
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vt_envs.core.registry import Registry
from vt_envs.errors import InvalidConfigError, UnknownToolError

__all__ = [
    "MAX_TIMEOUT_S",
    "Tool",
    "ToolRegistry",
    "ToolResult",
    "check_timeout",
    "resolve_tools",
    "tool_registry",
    "validate_arguments",
]

ENTRY_POINT_GROUP = "vt_envs.tools"

#: The longest deadline a user may set (about 11.6 days): past ~24.8 days some waits
#: (``epoll``, through ``selectors`` and ``subprocess``) overflow.
MAX_TIMEOUT_S = 1e6


def check_timeout(
    name: str, value: Any, *, optional: bool = False, limit: float = MAX_TIMEOUT_S
) -> float | None:
    """``value`` as a deadline in seconds, or :class:`InvalidConfigError` naming ``name``.

    A deadline is a real number (not a bool), finite, > 0 and at most
    ``limit`` (:data:`MAX_TIMEOUT_S` for what a user sets; ``math.inf`` where
    VT derives a deadline from checked ones and only the event loop waits on
    it); ``None`` passes only when ``optional`` (no limit). Every deadline is
    checked where it enters VT, because one NaN that reached the shared event
    loop would break its timer heap: a ``NaN`` deadline compares false with
    every other, and timers of *other* sessions queued behind it stop firing
    in order.
    """
    if value is None and optional:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        seconds = float(value)
        ok = math.isfinite(seconds) and 0 < seconds <= limit
    if not ok:
        at_most = f" and <= {limit:g}" if math.isfinite(limit) else ""
        none = " or None (no limit)" if optional else ""
        raise InvalidConfigError(
            f"{name} must be a finite number of seconds > 0{at_most}{none}, "
            f"got {value!r}. Fix: pass e.g. {name}=10.0."
        )
    return seconds


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced.

    Attributes:
        text: the text shown to the agent (already capped by the tool).
        images: images the tool returns, each ``HxWx3 uint8``.
        ok: ``False`` when the call failed because of its input or a timeout.
        error: a short machine-readable error kind (``"timeout"``,
            ``"syntax_error"``, ...) when ``ok`` is ``False``.
        metrics: numbers worth logging (``rows``, ``exec_s``, ``truncated``...).
        ends_episode: set when the call spent a resource the tool bounds for the
            whole episode (an SWE working copy over its disk quota): the env ends
            the episode on this step, truncated with this reason.
    """

    text: str
    images: tuple[np.ndarray, ...] = ()
    ok: bool = True
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    ends_episode: str | None = None

    @classmethod
    def failure(cls, text: str, error: str, **metrics: float) -> ToolResult:
        return cls(text=text, ok=False, error=error, metrics=metrics)


class Tool(abc.ABC):
    """Base class of every tool.

    Subclasses set the class attributes and implement :meth:`call`; the ones
    that keep per-episode state also override :meth:`open_session` and
    :meth:`close_session` (and :meth:`recover_session` if cleaning up after a
    cancelled call takes more than what their cancellation handler does).

    Class attributes:
        name: the name the agent uses (``"python"``, ``"sql"``); also the tag
            name in the tag grammar (``<python>...</python>``).
        description: one paragraph shown to the agent in the system prompt.
        parameters: JSON schema (``{"type": "object", "properties": ...,
            "required": [...]}``) of the call's arguments.
        tag_argument: the argument that the body of a tag call fills
            (``<python>CODE</python>`` → ``{"code": CODE}``); ``None`` when
            the tool can only be called with JSON.
        concurrent_calls: ``True`` if several calls may run on one session at
            the same time (stateless tools); ``False`` (default) serializes them.
        grace_s: how long past a call's deadline the env's backstop waits for
            the tool to return its own timeout result.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    tag_argument: ClassVar[str | None] = None
    concurrent_calls: ClassVar[bool] = False
    grace_s: ClassVar[float] = 2.0

    def __init__(self, *, timeout_s: float = 30.0):
        self.timeout_s = timeout_s

    @property
    def timeout_s(self) -> float:
        """The default deadline of one call, in seconds (checked by :func:`check_timeout`)."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._timeout_s = check_timeout("timeout_s", value)

    def deadline(self, timeout_s: float | None) -> float:
        """The deadline of one call: ``timeout_s`` as the env hands it (checked: a NaN,
        infinite, zero or negative one raises :class:`InvalidConfigError`), or
        :attr:`timeout_s` when it is ``None``."""
        if timeout_s is None:
            return self.timeout_s
        return check_timeout("timeout_s", timeout_s, limit=math.inf)

    async def open_session(self, task: Any, *, seed: int) -> Any:
        """Create per-episode state for ``task`` (a :class:`~vt_envs.core.task.Task`).

        Called once at reset, before the first call. ``seed`` is derived from
        the episode's seed: tools with randomness inside (an interpreter's
        ``random``) seed it from there, so a seeded episode replays exactly.
        Default: no state.
        """
        return None

    async def close_session(self, session: Any) -> None:
        """Release what :meth:`open_session` created. Must be idempotent."""

    async def recover_session(self, session: Any) -> None:
        """Make ``session`` usable again after a call on it was cancelled by the backstop.

        Runs before the session takes another call (bounded by
        :attr:`grace_s`). Default: nothing, for tools whose cancellation
        handling already resets the session.
        """

    @abc.abstractmethod
    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float
    ) -> ToolResult:
        """Run one call with already-validated ``arguments``, within ``timeout_s`` seconds.

        ``timeout_s`` is a developer's value (the env's, a tool server's): pass it
        through :meth:`deadline` before it reaches a timer.
        """

    async def aclose(self) -> None:
        """Release resources shared by all sessions (worker pools...)."""

    def spec(self) -> dict[str, Any]:
        """The OpenAI/Hermes function spec of this tool (for JSON tool calls)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, timeout_s={self.timeout_s})"


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def validate_arguments(schema: Mapping[str, Any], arguments: Any) -> str | None:
    """Check ``arguments`` against the subset of JSON schema tools use.

    Returns ``None`` when valid, else a one-line reason the agent can act on.
    Checks: object type, required keys, unknown keys (when
    ``additionalProperties`` is false), and the ``type``/``enum`` of each
    property. Never raises.
    """
    if not isinstance(arguments, Mapping):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = schema.get("properties", {})
    missing = [key for key in schema.get("required", []) if key not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    if schema.get("additionalProperties", True) is False:
        extra = [key for key in arguments if key not in properties]
        if extra:
            return (
                f"unknown argument(s): {', '.join(map(str, extra))}; "
                f"expected: {', '.join(properties)}"
            )
    for key, value in arguments.items():
        prop = properties.get(key)
        if not prop:
            continue
        expected = prop.get("type")
        if expected:
            kinds = expected if isinstance(expected, list) else [expected]
            allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))
            is_bool = isinstance(value, bool)
            if not isinstance(value, allowed) or (is_bool and "boolean" not in kinds):
                return f"argument {key!r} must be {' or '.join(kinds)}, got {type(value).__name__}"
        if "enum" in prop and value not in prop["enum"]:
            return f"argument {key!r} must be one of {prop['enum']}, got {value!r}"
    return None


class ToolRegistry(Registry[type[Tool]]):
    """Name → tool class: the built-ins, yours (``register(name, cls)`` or a lazy
    ``"module:Class"``), and the ``vt_envs.tools`` entry points of installed packages
    (read on the first lookup, so importing ``vt_envs`` stays cheap and a broken
    third-party plugin fails only when its tool is asked for). Registering a taken
    name replaces it; ``get("module:Class")`` loads a tool nobody registered."""

    def __init__(self) -> None:
        super().__init__("tool", entry_point_group=ENTRY_POINT_GROUP, replace=True)

    def create(self, name: str, **kwargs: Any) -> Tool:
        """Instantiate the tool registered as ``name`` with ``kwargs``."""
        return self.get(name)(**kwargs)

    def _missing(self, name: str) -> Exception:
        return UnknownToolError(name, self._items)


tool_registry = ToolRegistry()


def resolve_tools(specs: Any) -> list[Tool]:
    """The tools ``specs`` name: a :class:`Tool` as given; a name (``"python"``) is the
    tool registered under it (:data:`tool_registry`), built with its defaults; a
    mapping ``{"name": "python", "timeout_s": 5.0}`` builds it with those keywords.

    Raises:
        UnknownToolError: a name nobody registered (with "did you mean").
        InvalidConfigError: a spec of another type, or keywords the tool refuses.
    """
    if isinstance(specs, (str, Mapping, Tool)) or not isinstance(specs, Sequence):
        raise InvalidConfigError(
            f"extra_tools must be a list of tool names, Tools or {{'name': ..., **kwargs}} "
            f"mappings, got {type(specs).__name__}: {specs!r:.80}"
        )
    tools: list[Tool] = []
    for spec in specs:
        if isinstance(spec, Tool):
            tools.append(spec)
            continue
        if isinstance(spec, str):
            name, kwargs = spec, {}
        elif isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            name, kwargs = spec["name"], {k: v for k, v in spec.items() if k != "name"}
        else:
            raise InvalidConfigError(
                f"each extra tool is a registered tool's name, a Tool, or a mapping with a "
                f"'name' and the tool's keywords; got {spec!r:.80}"
            )
        cls = tool_registry.get(name)
        try:
            tools.append(cls(**kwargs))
        except TypeError as exc:
            raise InvalidConfigError(
                f"tool {name!r} ({cls.__name__}) refused {kwargs}: {exc}"
            ) from exc
    return tools


def compose_tools(
    own: Sequence[Tool], extra: Any, *, owner: str
) -> tuple[list[Tool], tuple[str, ...]]:
    """``(every tool, the extra ones' names)``: ``own`` then the tools ``extra`` names
    (:func:`resolve_tools`), for the env ``owner``.

    Raises:
        InvalidConfigError: an extra tool takes a name ``own`` has, or names repeat.
    """
    added = resolve_tools(extra)
    taken = {tool.name for tool in own} & {tool.name for tool in added}
    if taken:
        raise InvalidConfigError(
            f"extra_tools: {owner} already has the tools {sorted(taken)}; an extra tool "
            "needs a name of its own (a Tool subclass with another `name`)"
        )
    tools = [*own, *added]
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise InvalidConfigError(f"tool names must be unique, got {names}")
    return tools, tuple(tool.name for tool in added)
