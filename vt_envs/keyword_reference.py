"""Every keyword an env id accepts, with its default, type and meaning, read from the code.

``gym.make("VT-SQL-v0", **kwargs)`` takes the keywords of the id's builder (an
:func:`~vt_envs.tools.builder.env_builder` function): its own, the common
:class:`~vt_envs.core.env.ToolEnv` keywords it forwards, and the tool-server ones.
:func:`keywords` lists them as :class:`Keyword` records: the default is the one
``gym.make`` uses (the registration's ``kwargs``, else the signature's), the text is
the docstring entry that documents the name (the builder's, else ``ToolEnv``'s), so
each keyword is documented once, where it is declared.

``python -m vt_envs.keyword_reference --out docs/reference/env-keywords.md`` writes the
reference page of every ``VT-*`` id; ``--check`` exits 1 when the page is stale.
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vt_envs.core.builder import SERVER_KWARGS, TOOL_ENV_KWARGS
from vt_envs.core.cache import vt_cache_root
from vt_envs.core.docstrings import documented_names
from vt_envs.core.env import ToolEnv
from vt_envs.core.reference_pages import markdown, table_row, write_or_check
from vt_envs.errors import InvalidConfigError, console_main
from vt_envs.registration import builder_of, registered_envs, registration_of

__all__ = ["COMPUTED", "REQUIRED", "Keyword", "keywords", "main", "render_reference"]

#: The reference page, relative to the repository root.
REFERENCE_PAGE = "docs/reference/env-keywords.md"
COMMAND = f"python -m vt_envs.keyword_reference --out {REFERENCE_PAGE}"


class _Marker:
    """A default that is not a value: shown by its label."""

    def __init__(self, label: str):
        self.label = label

    def __repr__(self) -> str:
        return self.label


#: The default of a keyword that must be given.
REQUIRED = _Marker("required")
#: The default of a keyword the builder computes from others (giving it is refused).
COMPUTED = _Marker("computed")

#: Where tool_server= sends the tools: see docs/tool-server.md.
_SERVER = {
    "tool_server": (
        "str | None",
        "the URL of a ``vt-tool-server`` that runs this env's tools (the env, its tasks "
        "and its verifier stay here); ``None``: the tools run in this process.",
    ),
    "tool_server_token": (
        "str | None",
        "the shared secret sent to ``tool_server``; ``None``: ``$VT_TOOL_SERVER_TOKEN``.",
    ),
}
_SCOPE_ORDER = {"env": 0, "common": 1, "server": 2}


@dataclass(frozen=True)
class Keyword:
    """One keyword of an env id, as ``gym.make(id, **kwargs)`` takes it.

    Attributes:
        name: the keyword.
        default: what ``gym.make`` uses when it is not given: the id's registration
            ``kwargs``, else the builder's signature (``ToolEnv``'s for a common
            keyword it forwards); :data:`REQUIRED` when there is none, :data:`COMPUTED`
            when the builder derives it.
        annotation: its type as the signature writes it (``"int | None"``); ``""``
            when unannotated.
        doc: what it does, one line (the docstring entry that documents it).
        scope: ``"env"`` (the domain builder's own), ``"common"`` (a ``ToolEnv``
            keyword, forwarded or set by the builder) or ``"server"`` (where the
            tools run: ``tool_server``, ``tool_server_token``).
        note: how the builder treats a common keyword (fixed to a value, renamed,
            derived), from its ``@env_builder`` rules; ``""`` otherwise.
    """

    name: str
    default: Any
    annotation: str
    doc: str
    scope: str
    note: str = ""


def keywords(env_id: str) -> list[Keyword]:
    """Every keyword ``env_id`` accepts: its own, then the common ones, then the server's.

    Raises:
        UnknownNameError: ``env_id`` is not registered (with "did you mean").
        InvalidConfigError: its builder is not an ``@env_builder`` function, or a
            keyword is documented nowhere (the error lists them).
    """
    registration = registration_of(env_id)
    build = builder_of(env_id)
    where = f"{getattr(build, '__module__', '?')}.{getattr(build, '__qualname__', build)}"
    accepted = getattr(build, "accepted_kwargs", None)
    if accepted is None:
        raise InvalidConfigError(
            f"{registration.id}'s builder {where} is not decorated with @env_builder, so "
            "the keywords it accepts are unknown; decorate it with vt_envs.env_builder"
        )
    rules = getattr(build, "keyword_rules", {})
    own = inspect.signature(build).parameters  # the domain function's (functools.wraps)
    sources = _Sources(
        own={n: p for n, p in own.items() if p.kind is not inspect.Parameter.VAR_KEYWORD},
        common=inspect.signature(ToolEnv.__init__).parameters,
        docs=documented_names(build.__doc__),
        common_docs=documented_names(ToolEnv.__doc__),
        defaults=registration.kwargs,
        fixed=rules.get("fixed", {}),
        renamed=rules.get("renamed", {}),
        derived=rules.get("derived", {}),
    )
    found = sorted((sources.keyword(name) for name in accepted), key=sources.order)
    undocumented = [k.name for k in found if not k.doc]
    if undocumented:
        raise InvalidConfigError(
            f"{registration.id}: keywords documented nowhere: {', '.join(undocumented)}. "
            f"Give each a `name: what it does` entry in the docstring of {where}"
        )
    return found


@dataclass(frozen=True)
class _Sources:
    """Where one builder's keywords get their defaults, types and docs."""

    own: Mapping[str, inspect.Parameter]
    common: Mapping[str, inspect.Parameter]
    docs: Mapping[str, str]
    common_docs: Mapping[str, str]
    defaults: Mapping[str, Any]
    fixed: Mapping[str, tuple[Any, str]]
    renamed: Mapping[str, str]
    derived: Mapping[str, str]

    def keyword(self, name: str) -> Keyword:
        if name in SERVER_KWARGS:
            annotation, doc = _SERVER.get(name, ("", ""))
            return Keyword(name, self.defaults.get(name), annotation, doc, "server")
        declared = self.own.get(self.renamed.get(name, name)) or self.common.get(name)
        default: Any = REQUIRED
        if declared is not None and declared.default is not inspect.Parameter.empty:
            default = declared.default
        if name in self.fixed:
            default = self.fixed[name][0]
        if name in self.derived:
            default = COMPUTED
        default = self.defaults.get(name, default)
        scope = "common" if name in TOOL_ENV_KWARGS else "env"
        doc = self.docs.get(name) or (self.common_docs.get(name, "") if scope == "common" else "")
        return Keyword(name, default, _annotation(declared), doc, scope, self._note(name))

    def _note(self, name: str) -> str:
        if name in self.fixed:
            value, why = self.fixed[name]
            return f"fixed to ``{value!r}`` ({why}); another value is refused"
        if name in self.renamed:
            return f"this env's ``{self.renamed[name]}``: give one of the two"
        if name in self.derived:
            return f"computed from {self.derived[name]}; giving it is refused"
        return ""

    def order(self, keyword: Keyword) -> tuple[int, int, str]:
        """Own keywords in signature order, common ones in ``ToolEnv``'s, then the server's."""
        place = {"env": list(self.own), "common": list(self.common)}.get(keyword.scope, [])
        index = place.index(keyword.name) if keyword.name in place else len(place)
        return _SCOPE_ORDER[keyword.scope], index, keyword.name


def _annotation(parameter: inspect.Parameter | None) -> str:
    if parameter is None or parameter.annotation is inspect.Parameter.empty:
        return ""
    annotation = parameter.annotation  # a string under `from __future__ import annotations`
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


# ---------------------------------------------------------------------- the page

_MAX_DEFAULT_CHARS = 60


def render_reference(env_ids: Sequence[str] | None = None) -> str:
    """The Markdown reference page of ``env_ids`` (default: every ``VT-*`` id)."""
    if env_ids is None:
        env_ids = [i for i in registered_envs() if i.startswith("VT-")]
    parts = [_INTRO.format(command=COMMAND)]
    for env_id in env_ids:
        registration = registration_of(env_id)
        rows = [_row(k) for k in keywords(env_id)]
        parts.append(
            f"## {registration.id}\n\n{markdown(registration.description)}.\n\n"
            "| keyword | default | type | what it does |\n|---|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


_INTRO = """\
# Env keywords: every keyword of every VT env id

<!-- Generated from the code by `{command}`: do not edit by hand. -->

What `gym.make(id, **kwargs)` (or `vt_envs.make`) accepts for each id: its default
(what the env uses when the keyword is not given), its type, and what it does. The
page is generated from the builders' signatures and docstrings (`vt_envs.keywords`),
so do not edit it by hand: change the docstring and regenerate it with
`{command}` (`tests/test_keywords.py` fails when it is stale).

In each table the id's own keywords come first, then the common `ToolEnv` keywords
(marked *common*; see [concepts](../concepts.md#common-keywords)), then the ones that
send its tools to a [tool server](../tool-server.md) (marked *server*). "required":
there is no default; "computed": the builder computes it, and giving it is refused."""


def _row(keyword: Keyword) -> str:
    name = f"`{keyword.name}`" + ("" if keyword.scope == "env" else f" *{keyword.scope}*")
    text = markdown(keyword.doc)
    if keyword.note:
        note = markdown(keyword.note)
        text += f" **{note[0].upper()}{note[1:]}.**"
    cells = [name, _code(_default_text(keyword.default)), _code(keyword.annotation), text]
    return table_row(cells)


def _default_text(value: Any) -> str:
    """A default as short, machine-independent text: repr (sequences cut item by item),
    names for functions and objects, the cache directory and home shown by name."""
    if isinstance(value, _Marker):
        return value.label
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_default_text(v) for v in value]
        if isinstance(value, (set, frozenset)):
            items.sort()  # a set's order changes from run to run
        return _sequence(
            items, "()" if isinstance(value, tuple) else "[]" if isinstance(value, list) else "{}"
        )
    if callable(value) and hasattr(value, "__qualname__"):  # a function or class
        text = value.__qualname__
    elif type(value).__repr__ is object.__repr__:  # "<Obj at 0x...>": name its type
        text = f"{type(value).__name__}()"
    else:
        text = repr(value)
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    for path, name in ((str(vt_cache_root()), "$VT_CACHE_DIR"), (str(Path.home()), "~")):
        if len(path) > 1:  # (a home of "/" names no machine)
            text = text.replace(path, name)
    if len(text) > _MAX_DEFAULT_CHARS:
        text = text[: _MAX_DEFAULT_CHARS - 4].rstrip() + " ..."
    return text


def _sequence(items: list[str], brackets: str) -> str:
    shown: list[str] = []
    for item in items:
        if len(", ".join([*shown, item])) > _MAX_DEFAULT_CHARS - 6:
            shown.append("...")
            break
        shown.append(item)
    trailing = "," if brackets == "()" and len(items) == 1 else ""
    return brackets[0] + ", ".join(shown) + trailing + brackets[1]


def _code(text: str) -> str:
    if not text:
        return ""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if fence == "`" else f"`` {text} ``"


# ---------------------------------------------------------------------- the command


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vt_envs.keyword_reference [--out PATH] [--check]``: write (or check) the page."""
    parser = argparse.ArgumentParser(
        prog="python -m vt_envs.keyword_reference",
        description="Write the reference page of every VT env id's keywords.",
    )
    parser.add_argument("--out", help=f"the page to write (default: stdout; {REFERENCE_PAGE})")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if --out differs from what would be written"
    )
    args = parser.parse_args(argv)
    out = args.out or (REFERENCE_PAGE if args.check else None)
    return write_or_check(render_reference(), out, check=args.check, command=COMMAND)


if __name__ == "__main__":
    console_main("python -m vt_envs.keyword_reference", main)()
