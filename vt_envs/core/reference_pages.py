"""What the generated option references share: docstring markup as Markdown,
table rows, and writing a page or checking that the committed one is current.

The pages (``docs/reference/env-keywords.md`` from :mod:`vt_envs.keyword_reference`,
``docs/reference/recipe.md`` from :mod:`vt_train.reference`) are generated from
the docstrings that document each option (:mod:`vt_envs.core.docstrings`), so an
option's meaning is written once.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["markdown", "table_row", "write_or_check"]

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def markdown(text: str) -> str:
    """Docstring markup as Markdown: ``x`` -> `x`, :class:`~a.B` -> `B` (``~`` shortens
    to the last name, as Sphinx does; a module keeps its full name), and ``<`` outside
    code escaped (``<submit>`` is not an HTML tag)."""
    text = _ROLE.sub(_role, text).replace("``", "`")
    parts = text.split("`")  # the odd parts are code
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _role(match: re.Match[str]) -> str:
    role, target = match[0].split("`")[0], match[1]
    short = "~" in match[0] and role != ":mod:"
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def table_row(cells: Sequence[str]) -> str:
    """One Markdown table row (a ``|`` inside a cell escaped)."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def write_or_check(page: str, out: str | Path | None, *, check: bool, command: str) -> int:
    """Write ``page`` to ``out`` (stdout when ``None``), or with ``check`` exit code 1
    and a short diff on stderr when the file at ``out`` differs (``command``
    regenerates it); 0 otherwise."""
    if check:
        path = Path(out)  # type: ignore[arg-type]
        current = path.read_text() if path.exists() else ""
        if current == page:
            print(f"{path} is up to date")
            return 0
        diff = difflib.unified_diff(
            current.splitlines(), page.splitlines(), str(path), "generated", lineterm="", n=1
        )
        print(
            f"{path} is stale (or missing): regenerate it with `{command}`\n"
            + "\n".join(list(diff)[:40]),
            file=sys.stderr,
        )
        return 1
    if out is None:
        sys.stdout.write(page)
        return 0
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    print(f"wrote {path} ({page.count(chr(10))} lines)", file=sys.stderr)
    return 0
