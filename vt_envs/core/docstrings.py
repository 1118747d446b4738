"""What a Google-style docstring says about each name it documents.

Option references (every keyword of every env id, every recipe field) are
generated from the docstrings that already document them, so there is one
place to write an option's meaning. :func:`documented_names` reads the
``name: text`` entries of a docstring's sections (``Args:``, ``Attributes:``,
or a domain's own headings such as ``Tasks:``), including grouped entries
(``holdout, holdout_seed: ...``), which document every name they list.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["documented_names"]

# "name: text", "a, b, c: text" or "``name``: text" at the start of an entry line.
_ENTRY = re.compile(
    r"^(?P<names>`*[A-Za-z_]\w*`*(?:\s*,\s*`*[A-Za-z_]\w*`*)*)\s*:(?:\s+(?P<text>.*))?$"
)
# A section heading: a line ending with ":" (with or without words before, "Tasks:",
# "Interpreter (:class:`PythonTool`):"), indented no deeper than the entries.
_HEADING = re.compile(r"^[A-Z][^:]*(?:\([^)]*\))?:$")


def documented_names(doc: str | None) -> dict[str, str]:
    """``name -> text`` for each entry of ``doc``'s sections, in order.

    An entry is a line, indented one level inside a section heading, of the form
    ``name: text`` or ``a, b: text``; the lines indented deeper that follow it
    continue its text. Text is joined into one line (whitespace collapsed). A name
    documented twice keeps its first entry. Prose outside sections is ignored.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    found: dict[str, str] = {}
    entry_indent: int | None = None  # the indentation of entries in this section
    current: list[str] | None = None  # the names the entry being read documents
    text: list[str] = []

    def flush() -> None:
        if current:
            joined = " ".join(" ".join(text).split())
            for name in current:
                found.setdefault(name, joined)

    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:
            continue
        if entry_indent is None or indent < entry_indent:
            flush()
            current, text = None, []
            entry_indent = None
            if _HEADING.match(stripped):
                entry_indent = -1  # set by the first entry line below the heading
            continue
        if entry_indent == -1:
            entry_indent = indent
        if indent == entry_indent:
            flush()
            current, text = None, []
            match = _ENTRY.match(stripped)
            if match:
                current = [n.strip().strip("`") for n in match["names"].split(",")]
                text = [match["text"] or ""]
        elif current is not None:  # deeper: the entry goes on
            text.append(stripped)
    flush()
    return found
