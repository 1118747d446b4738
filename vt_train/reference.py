"""The recipe reference: every field a ``vt-train`` recipe can set, generated.

Each field is documented once, in its dataclass's ``Attributes:`` docstring
section; this module walks :class:`~vt_train.config.TrainConfig` and the
dataclasses nested in it, reads those entries
(:func:`vt_envs.core.docstrings.documented_names`) and writes the page
``docs/reference/recipe.md``, with a table of the algorithm presets::

    python -m vt_train.reference --out docs/reference/recipe.md          # regenerate
    python -m vt_train.reference --out docs/reference/recipe.md --check  # exit 1 if stale

A field nobody documented is an error (:class:`UndocumentedFieldError`), so the
generator, and the test that compares the committed page with it, fail until
the new field has its docstring entry.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from vt_envs.core.docstrings import documented_names
from vt_envs.core.reference_pages import markdown, table_row, write_or_check
from vt_envs.errors import VTError
from vt_train.algorithms import PRESETS, AlgorithmConfig
from vt_train.config import TrainConfig, load_config

__all__ = [
    "MAPPING_SECTIONS",
    "REGENERATE",
    "Field",
    "UndocumentedFieldError",
    "main",
    "preset_differences",
    "recipe_fields",
    "render_page",
]

#: The regenerate command the page and ``--check`` name.
REGENERATE = "python -m vt_train.reference --out docs/reference/recipe.md"

#: Fields that hold a mapping of another dataclass's fields rather than that
#: dataclass itself: ``(owner, field name) -> the dataclass its keys belong to``.
#: Their keys are documented as a section (``algorithm.clip_high``), with that
#: dataclass's defaults.
MAPPING_SECTIONS: dict[tuple[type, str], type] = {(TrainConfig, "algorithm"): AlgorithmConfig}


class UndocumentedFieldError(VTError, ValueError):
    """Raised when a config field has no entry in its dataclass's docstring."""


@dataclass(frozen=True)
class Field:
    """One recipe field.

    Attributes:
        key: the dotted key a recipe or an override sets (``rollout.n``).
        type: its annotation, as written (``str | None``).
        default: the value a run gets when the recipe leaves it out.
        doc: what it does: its docstring entry, on one line.
        owner: the dataclass that declares it.
    """

    key: str
    type: str
    default: Any
    doc: str
    owner: type

    @property
    def section(self) -> str:
        """The dotted prefix of ``key`` (``""`` at the top level)."""
        return self.key.rpartition(".")[0]

    @property
    def default_text(self) -> str:
        """``default`` as a recipe would write it (YAML), e.g. ``[jsonl, tensorboard]``."""
        return _yaml(self.default)


# ------------------------------------------------------------------- walking


def recipe_fields(
    root: type = TrainConfig, *, mapping_sections: Mapping[tuple[type, str], type] | None = None
) -> list[Field]:
    """Every leaf field of dataclass ``root``, depth first in declaration order.

    A field whose type is a dataclass (or that :data:`MAPPING_SECTIONS` maps to
    one) is a section: its fields follow with dotted keys (``rollout.n``).
    Raises :class:`UndocumentedFieldError` listing every dotted key, sections
    included, that its dataclass's docstring does not document.
    """
    sections = MAPPING_SECTIONS if mapping_sections is None else mapping_sections
    fields: list[Field] = []
    undocumented: list[str] = []
    _walk(root, "", sections, fields, undocumented)
    if undocumented:
        raise UndocumentedFieldError(
            f"config fields without documentation: {', '.join(undocumented)}. Document each "
            "in its dataclass's docstring, under 'Attributes:' ('name: what it does'), then "
            f"regenerate the reference: {REGENERATE}"
        )
    return fields


def _walk(
    cls: type,
    prefix: str,
    sections: Mapping[tuple[type, str], type],
    out: list[Field],
    undocumented: list[str],
) -> None:
    docs = documented_names(cls.__doc__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        doc = docs.get(f.name, "").strip()
        if not doc:
            undocumented.append(key)
        section = _section_class(cls, f.name, hints[f.name], sections)
        if section is not None:
            _walk(section, key + ".", sections, out, undocumented)
            continue
        out.append(Field(key, _type_name(hints[f.name]), _default(f), doc, cls))


def _section_class(
    cls: type, name: str, annotation: Any, sections: Mapping[tuple[type, str], type]
) -> type | None:
    if (cls, name) in sections:
        return sections[(cls, name)]
    return annotation if dataclasses.is_dataclass(annotation) else None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _type_name(annotation: Any) -> str:
    """``annotation`` as source code writes it: ``dict[str, Any]``, ``float | None``."""
    if annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    if annotation is Any:
        return "Any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    return getattr(annotation, "__name__", str(annotation))


def _yaml(value: Any) -> str:
    """``value`` in YAML flow style, deterministic (no addresses, no machine paths)."""
    if value is dataclasses.MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # quoted when YAML would read it as something else
        return value if value and yaml.safe_load(value) == value else json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no readable rendering of default {type(value).__name__}")


# ------------------------------------------------------------------- presets


def preset_differences() -> dict[str, dict[str, Any]]:
    """Preset name -> the :class:`AlgorithmConfig` fields it resolves to that differ
    from the defaults, as a run with ``algo=NAME`` and the default recipe gets them
    (resolved by :meth:`TrainConfig.algorithm_config`, so fields the trainer fills
    in from the rest of the recipe are included)."""
    defaults = dataclasses.asdict(AlgorithmConfig())
    table = {}
    for name in PRESETS.names():
        resolved = dataclasses.asdict(load_config(overrides=[f"algo={name}"]).algorithm_config())
        table[name] = {k: v for k, v in resolved.items() if v != defaults[k]}
    return table


# ------------------------------------------------------------------- the page


def _prose(cls: type) -> str:
    """The docstring of ``cls`` before its first section (``Attributes:``), one line."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    prose = re.split(r"^\w[\w ]*:$", doc, maxsplit=1, flags=re.M)[0]
    return " ".join(prose.split())


def _section_heading(section: str, owner: type) -> str:
    where = f"`{section}.*`" if section else "Top level"
    return f"## {where}: {owner.__name__}"


def _intro() -> list[str]:
    return [
        "# Recipe reference",
        "",
        "<!-- Generated by vt_train.reference from the config dataclasses' docstrings: do not "
        "edit by hand. -->",
        "",
        "Every field a `vt-train` recipe can set, generated from the docstrings of "
        "`vt_train.config.TrainConfig` and the dataclasses nested in it (do not edit by "
        f"hand; after changing a field or its docstring, regenerate with `{REGENERATE}`; "
        "a test fails while the page is stale).",
        "",
        "A recipe is a YAML file holding any subset of these fields, nested by section "
        "(`rollout: {n: 8}`); a field it leaves out takes the default below. On the command "
        "line, `vt-train RECIPE key=value ...` overrides single fields by their dotted key, "
        "with YAML values: `vt-train RECIPE rollout.n=8 algo=ppo algorithm.clip_high=0.28`. "
        "`vt-train check RECIPE` prints the resolved config.",
    ]


def _table(rows: Sequence[Field]) -> list[str]:
    lines = ["| key | default | type | what it does |", "| --- | --- | --- | --- |"]
    for f in rows:
        cells = [f"`{f.key}`", f"`{f.default_text}`", f"`{f.type}`", markdown(f.doc)]
        lines.append(table_row(cells))
    return lines


def _presets_table() -> list[str]:
    table = preset_differences()
    names = list(table)
    keys = [
        f.name
        for f in dataclasses.fields(AlgorithmConfig)
        if any(f.name in table[n] for n in names)
    ]
    defaults = dataclasses.asdict(AlgorithmConfig())
    lines = [
        "## Algorithm presets",
        "",
        "`algo: NAME` picks a preset: a named set of `algorithm.*` fields; `algorithm:` "
        "overrides single fields of it. Each column shows what the preset resolves to "
        "where it differs from the defaults above (blank: the default), with the default "
        "recipe; † marks a value the trainer fills in from the rest of the recipe rather "
        "than the preset:",
        "",
        "| field | default | " + " | ".join(f"`{n}`" for n in names) + " |",
        "| --- | --- |" + " --- |" * len(names),
    ]
    for key in keys:
        cells = [f"`{key}`", f"`{_yaml(defaults[key])}`"]
        for name in names:
            if key not in table[name]:
                cells.append("")
                continue
            derived = "" if key in PRESETS.get(name) else " †"
            cells.append(f"`{_yaml(table[name][key])}`{derived}")
        lines.append(table_row(cells))
    rules = inspect.getdoc(TrainConfig.algorithm_config) or ""
    lines += ["", "† " + " ".join(rules.split("\n\n", 1)[-1].split())]
    return [markdown(line) for line in lines]


def render_page(root: type = TrainConfig) -> str:
    """The Markdown page: intro, one table per dataclass, then the presets."""
    fields = recipe_fields(root)
    lines = _intro()
    by_section: dict[str, list[Field]] = {}
    for f in fields:
        by_section.setdefault(f.section, []).append(f)
    for section, rows in by_section.items():
        owner = rows[0].owner
        lines += ["", _section_heading(section, owner), "", markdown(_prose(owner))]
        for (parent, name), cls in MAPPING_SECTIONS.items():
            if cls is owner and section.rpartition(".")[2] == name:
                doc = documented_names(parent.__doc__)[name]
                lines += ["", markdown(f"``{section}``: {doc}")]
        lines += ["", *_table(rows)]
    lines += ["", *_presets_table()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vt_train.reference [--out PATH] [--check]``."""
    parser = argparse.ArgumentParser(prog="python -m vt_train.reference", description=__doc__)
    parser.add_argument("--out", default="docs/reference/recipe.md", help="the page to write")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the page differs"
    )
    ns = parser.parse_args(argv)
    return write_or_check(render_page(), ns.out, check=ns.check, command=REGENERATE)


if __name__ == "__main__":
    sys.exit(main())
