"""A domain declared as data: an env id's typed config, and how each part is built from it.

Every VT env id is a :class:`Domain`: a dataclass of the id's own keywords
(typed, with defaults, documented in its docstring), the episode budgets and
formats it sets on :class:`~vt_envs.core.env.ToolEnv` (data), and one function
per part — its tools, its task source, its verifier — each taking the config.
Nothing else about the id lives in code: the keywords a user may pass are the
config's fields plus ``ToolEnv``'s, merged with the defaults and checked once
(:func:`vt_envs.tools.builder.domain_builder` makes the registered builder), and
a tool server builds only the parts it serves (:meth:`Domain.toolset`), never
the verifier, the prompt or the tokenizer.

A domain folder holds the same files in every domain: ``config.py`` (the
config dataclass and the ``Domain``), ``tools``, ``tasks``, ``verifier`` and
``oracle`` modules.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from vt_envs.core.env import ToolEnv
from vt_envs.core.task import TaskSource
from vt_envs.core.tool import Tool, compose_tools
from vt_envs.core.verifier import Verifier
from vt_envs.errors import InvalidConfigError

__all__ = ["Domain", "Toolset"]

C = TypeVar("C")

# ToolEnv keywords a domain's parts supply; never a user's keyword or an episode default.
_PARTS = frozenset({"tools", "tasks", "verifier", "instructions", "name"})


@dataclass
class Toolset:
    """What a tool server needs of an env id: its tools by name and its task source."""

    tools: dict[str, Tool]
    tasks: TaskSource

    async def aclose(self) -> None:
        """Close the tools (their pools and workers)."""
        for tool in self.tools.values():
            await tool.aclose()


@dataclass(frozen=True)
class Domain(Generic[C]):
    """One env id, declared.

    Attributes:
        id: the env id (``"VT-SQL-v0"``); the built env's ``name``.
        config: a dataclass whose fields are the id's own keywords: typed, with
            defaults, each documented by a ``name: text`` entry of its docstring.
            Its ``__post_init__`` may refuse a combination with
            :class:`~vt_envs.errors.InvalidConfigError`.
        tools: ``config -> [Tool, ...]``, the id's own tools.
        tasks: ``config -> TaskSource``.
        verifier: ``config -> Verifier``.
        instructions: the system prompt's task description, or ``config -> str``
            when the config changes it (VT-Visual-v0 states its box convention).
        episode: the ``ToolEnv`` keywords this id sets another default for
            (``{"max_turns": 5, ...}``); a user's keyword overrides them.
        env_kwargs: ``config -> {ToolEnv keyword: value}`` for keywords the config
            decides (``examples``, ``max_tool_calls`` from a renamed keyword).
        env_class: the env class built (a :class:`ToolEnv` subclass).
        fixed, renamed, derived: common keywords the id sets itself (passed to
            ``env_class`` with their fixed value), names otherwise, or computes: see
            :func:`vt_envs.tools.builder.env_builder`.
    """

    id: str
    config: type[C]
    tools: Callable[[C], Sequence[Tool]]
    tasks: Callable[[C], TaskSource]
    verifier: Callable[[C], Verifier]
    instructions: str | Callable[[C], str]
    episode: Mapping[str, Any] = field(default_factory=dict)
    env_kwargs: Callable[[C], Mapping[str, Any]] | None = None
    env_class: type[ToolEnv] = ToolEnv
    fixed: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    renamed: Mapping[str, str] = field(default_factory=dict)
    derived: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.config, type) and dataclasses.is_dataclass(self.config)):
            raise InvalidConfigError(
                f"{self.id}: config must be a dataclass, got {self.config!r}; "
                "declare the id's keywords as a @dataclass"
            )
        own = {f.name for f in dataclasses.fields(self.config)}
        common = set(inspect.signature(ToolEnv.__init__).parameters) - {"self"}
        clash = sorted(set(self.episode) & (_PARTS | own))
        unknown = sorted(set(self.episode) - common)
        if clash or unknown:
            raise InvalidConfigError(
                f"{self.id}: episode defaults must be ToolEnv keywords the config does not "
                f"declare; {clash or unknown} are not (ToolEnv takes {sorted(common - _PARTS)})"
            )

    # -- the keywords -------------------------------------------------------------

    def configure(self, kwargs: Mapping[str, Any]) -> tuple[C, dict[str, Any]]:
        """``(config, ToolEnv keywords)`` for a user's (already checked) keywords: the
        config's fields into the config, the rest over the episode defaults."""
        own = {f.name for f in dataclasses.fields(self.config)}
        config = self.config(**{k: v for k, v in kwargs.items() if k in own})
        rest = {k: v for k, v in kwargs.items() if k not in own}
        return config, {**self.episode, **rest}

    def signature(self) -> inspect.Signature:
        """The builder's signature: the config's fields, the episode defaults, then
        ``**env_kwargs`` (every other ``ToolEnv`` keyword). Annotations as written."""
        kw = inspect.Parameter.KEYWORD_ONLY
        common = inspect.signature(ToolEnv.__init__).parameters
        params = [
            inspect.Parameter(f.name, kw, default=_default(f), annotation=f.type)
            for f in dataclasses.fields(self.config)
        ]
        params += [
            inspect.Parameter(name, kw, default=value, annotation=common[name].annotation)
            for name, value in self.episode.items()
        ]
        params.append(inspect.Parameter("env_kwargs", inspect.Parameter.VAR_KEYWORD))
        return inspect.Signature(params, return_annotation=self.env_class.__name__)

    def annotations(self) -> dict[str, Any]:
        """The declared type of each keyword the signature names, evaluated."""
        common = typing.get_type_hints(ToolEnv.__init__)
        return {**{n: common[n] for n in self.episode}, **typing.get_type_hints(self.config)}

    def builder_doc(self) -> str:
        """The builder's docstring: the config's (its fields' entries). The episode
        defaults are ``ToolEnv``'s keywords, documented there."""
        doc = inspect.cleandoc(self.config.__doc__ or "")
        body = "\n".join(doc.splitlines()[1:]).strip()  # its sections, without its summary
        return f"Build {self.id} (declared by :class:`{self.config.__qualname__}`).\n\n{body}"

    # -- the parts ----------------------------------------------------------------

    def make(self, kwargs: Mapping[str, Any]) -> ToolEnv:
        """The env for a user's (already checked) keywords."""
        config, env_kwargs = self.configure(kwargs)
        decided = {name: value for name, (value, _) in self.fixed.items()}
        if self.env_kwargs is not None:
            decided.update(self.env_kwargs(config))
        return self.env_class(
            tools=list(self.tools(config)),
            tasks=self.tasks(config),
            verifier=self.verifier(config),
            instructions=(
                self.instructions(config) if callable(self.instructions) else self.instructions
            ),
            name=self.id,
            **{**decided, **env_kwargs},
        )

    def toolset(self, kwargs: Mapping[str, Any]) -> Toolset:
        """Only the tools (``extra_tools=`` included) and the task source for these
        (already checked) keywords: what a tool server builds."""
        config, env_kwargs = self.configure(kwargs)
        own = self.tools(config)
        tools, _ = compose_tools(own, env_kwargs.get("extra_tools", ()), owner=self.id)
        return Toolset({tool.name: tool for tool in tools}, self.tasks(config))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty
