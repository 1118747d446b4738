"""``editor``: SWE-agent's ``str_replace_editor`` command set over the episode's working copy.

Commands (JSON arguments; every mistake is an observation, never an exception):

- ``view`` ``path`` [``view_range: [start, end]``, end ``-1`` = to the end]: a
  file with line numbers (``cat -n`` style), or a directory two levels deep
  (hidden entries skipped). A file longer than ``max_view_chars`` is cut, with
  a hint to search it with ``grep -n`` and view a range.
- ``create`` ``path`` ``file_text``: a new file (parent directories made);
  refuses to overwrite.
- ``str_replace`` ``path`` ``old_str`` [``new_str``]: replaces the one
  occurrence of ``old_str``; refuses zero occurrences, and several (naming
  the line of each). Shows the edited region with line numbers.
- ``insert`` ``path`` ``insert_line`` ``new_str``: inserts after line
  ``insert_line`` (0: at the top), range-checked.
- ``undo_edit`` ``path``: reverts the last ``create`` / ``str_replace`` /
  ``insert`` of that file (per-file history, kept for the episode).

Paths are relative to the repository root or absolute under ``/tmp/repo``;
anything outside, and any symlink on the way, is refused
(:class:`~vt_envs.domains.swe.files.SafeRoot`), and so is anything that is not
a regular file when it is opened (a FIFO, a socket: checked on the open
descriptor, never blocking). Files are edited on the host side of the working
copy, so the editor survives the bash shell being restarted after a timeout.
A write the copy has no room for (its disk quota) is refused and changes
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vt_envs.core.tool import Tool, ToolResult
from vt_envs.domains.swe.files import NoSpaceError, PathError, SafeRoot
from vt_envs.errors import InvalidConfigError

__all__ = ["COMMANDS", "EditorSession", "EditorTool"]

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
_SNIPPET_LINES = 4


@dataclass
class EditorSession:
    """The editor's state for one episode: the working copy and each file's undo history
    (``None`` in a history means the file did not exist before that edit)."""

    files: SafeRoot
    history: dict[str, list[bytes | None]] = field(default_factory=dict)
    closed: bool = False


def _numbered(text: str, first: int = 1) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(text.split("\n"), start=first))


def _lines(text: str) -> tuple[list[str], str]:
    """A file's lines as ``cat -n`` counts them, and its final newline (``""`` if none)."""
    if text.endswith("\n"):
        return text[:-1].split("\n"), "\n"
    return text.split("\n"), ""


class EditorTool(Tool):
    """View, create and edit files of the working copy (see the module docstring).

    Args:
        workspaces: ``task -> SafeRoot`` of the episode's working copy (the env binds it,
            so the editor and bash see one copy).
        max_view_chars: the most characters one ``view`` returns.
        max_file_bytes: files larger than this are not opened.
    """

    name: ClassVar[str] = "editor"
    description: ClassVar[str] = (
        "View, create and edit files. Commands: view (a file with line numbers, or a "
        "directory), create (a new file), str_replace (replace one exact, unique occurrence of "
        "old_str with new_str), insert (new_str after line insert_line), undo_edit."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": list(COMMANDS)},
            "path": {"type": "string", "description": "relative to the repository root"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["command", "path"],
        "additionalProperties": False,
    }
    concurrent_calls: ClassVar[bool] = False

    def __init__(
        self,
        workspaces: Callable[[Any], SafeRoot] | None = None,
        *,
        max_view_chars: int = 16_000,
        max_file_bytes: int = 2 << 20,
        timeout_s: float = 10.0,
    ):
        super().__init__(timeout_s=timeout_s)
        if max_view_chars < 500:
            raise InvalidConfigError(f"max_view_chars must be >= 500, got {max_view_chars}")
        self._workspaces = workspaces
        self.max_view_chars = max_view_chars
        self.max_file_bytes = max_file_bytes

    def bind(self, workspaces: Callable[[Any], SafeRoot]) -> None:
        """Use ``workspaces(task)`` as the episode's working copy."""
        self._workspaces = workspaces

    async def open_session(self, task: Any, *, seed: int = 0) -> EditorSession:
        if self._workspaces is None:
            raise InvalidConfigError("EditorTool is not bound to a working copy")
        return EditorSession(self._workspaces(task))

    async def close_session(self, session: EditorSession) -> None:
        session.closed = True
        session.history.clear()

    async def call(
        self, session: EditorSession, arguments: Mapping[str, Any], *, timeout_s: float
    ) -> ToolResult:
        if session is None or session.closed:
            return ToolResult.failure("Error: the editor is closed for this episode.", "closed")
        command = arguments.get("command")
        try:
            rel = session.files.relative(arguments.get("path", ""))
            handler = getattr(self, f"_{command}", None) if command in COMMANDS else None
            if handler is None:
                raise PathError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
            return ToolResult(handler(session, rel, arguments))
        except NoSpaceError as exc:
            return ToolResult.failure(
                f"Error: {exc}: the repository is at its disk quota (a limit on its data and "
                "on its number of files and directories), and the file is unchanged. Delete "
                "what you do not need to make room.",
                "no_space",
            )
        except PathError as exc:
            return ToolResult.failure(f"Error: {exc}", "bad_arguments")

    # ------------------------------------------------------------ commands

    def _view(self, s: EditorSession, rel: str, args: Mapping[str, Any]) -> str:
        kind = s.files.kind(rel)
        if kind is None:
            raise PathError(f"{s.files.shown(rel)} does not exist")
        if kind == "dir":
            if args.get("view_range") is not None:
                raise PathError("view_range applies to files, not directories")
            entries = [
                s.files.shown(e.path) + ("/" if e.is_dir else "")
                for e in s.files.walk(rel, max_depth=2)
                if not any(part.startswith(".") for part in e.path.split("/"))
            ]
            listing = "\n".join(entries) or "(empty)"
            return (
                f"Files and directories in {s.files.shown(rel)}, two levels deep "
                f"(hidden ones left out):\n{listing}"
            )
        if kind != "file":
            raise PathError(f"{s.files.shown(rel)} is not a regular file (a symlink?)")
        text = self._text(s, rel)
        lines, _ = _lines(text)
        first, last = 1, len(lines)
        view_range = args.get("view_range")
        if view_range is not None:
            first, last = self._range(view_range, len(lines))
        body = _numbered("\n".join(lines[first - 1 : last]), first)
        if len(body) > self.max_view_chars:
            body = body[: self.max_view_chars].rsplit("\n", 1)[0]
            return (
                f"{body}\n<response clipped: this file is too long to show at once. Search it "
                "with `grep -n PATTERN FILE` in bash, then view the lines you need with "
                "view_range.>"
            )
        where = "" if view_range is None else f", lines {first}-{last}"
        return f"Here is {s.files.shown(rel)}{where} with line numbers:\n{body}"

    def _range(self, view_range: Any, n: int) -> tuple[int, int]:
        if (
            not isinstance(view_range, list)
            or len(view_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
        ):
            raise PathError(f"view_range must be two integers [start, end], got {view_range!r}")
        first, last = view_range
        last = n if last == -1 else last
        if not 1 <= first <= n:
            raise PathError(f"view_range start {first} is outside the file's lines 1 to {n}")
        if not first <= last <= n:
            raise PathError(
                f"view_range end {view_range[1]} must be between start {first} and {n} "
                "(or -1 for the end of the file)"
            )
        return first, last

    def _create(self, s: EditorSession, rel: str, args: Mapping[str, Any]) -> str:
        text = args.get("file_text")
        if not isinstance(text, str):
            raise PathError("create needs file_text (the new file's content)")
        if s.files.kind(rel) is not None:
            raise PathError(
                f"{s.files.shown(rel)} already exists; create never overwrites. Edit it with "
                "str_replace or insert"
            )
        s.files.write(rel, text.encode(), create_parents=True)
        s.history.setdefault(rel, []).append(None)
        return f"Created {s.files.shown(rel)} ({len(text.splitlines())} lines)."

    def _str_replace(self, s: EditorSession, rel: str, args: Mapping[str, Any]) -> str:
        old, new = args.get("old_str"), args.get("new_str", "")
        if not isinstance(old, str) or not old:
            raise PathError("str_replace needs old_str (the exact text to replace)")
        if not isinstance(new, str):
            raise PathError("new_str must be a string")
        text = self._text(s, rel)
        count = text.count(old)
        if count == 0:
            raise PathError(
                f"no replacement was made: old_str did not appear verbatim in "
                f"{s.files.shown(rel)} (check whitespace and indentation)"
            )
        if count > 1:
            lines = []
            start = text.find(old)
            while start != -1:
                lines.append(text.count("\n", 0, start) + 1)
                start = text.find(old, start + 1)
            raise PathError(
                f"no replacement was made: old_str occurs {count} times, at lines "
                f"{', '.join(map(str, lines))}; include more context to make it unique"
            )
        start = text.index(old)
        edited = text.replace(old, new, 1)
        self._save(s, rel, text, edited)
        line = text.count("\n", 0, start) + 1
        return self._snippet(s, rel, edited, line, line + new.count("\n"), "edited")

    def _insert(self, s: EditorSession, rel: str, args: Mapping[str, Any]) -> str:
        after, new = args.get("insert_line"), args.get("new_str")
        if not isinstance(new, str):
            raise PathError("insert needs new_str (the text to insert)")
        text = self._text(s, rel)
        lines, trailing = _lines(text)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= len(lines):
            raise PathError(
                f"insert_line must be an integer between 0 and {len(lines)} (the file's line "
                f"count; 0 inserts at the top), got {after!r}"
            )
        added = new.split("\n")
        edited = "\n".join([*lines[:after], *added, *lines[after:]]) + trailing
        self._save(s, rel, text, edited)
        return self._snippet(s, rel, edited, after + 1, after + len(added), "inserted into")

    def _undo_edit(self, s: EditorSession, rel: str, args: Mapping[str, Any]) -> str:
        history = s.history.get(rel)
        if not history:
            raise PathError(f"no edit of {s.files.shown(rel)} to undo")
        previous = history.pop()
        if previous is None:
            s.files.remove(rel)
            return f"Undid the creation of {s.files.shown(rel)} (removed)."
        s.files.write(rel, previous)
        lines, _ = _lines(previous.decode("utf-8", errors="replace"))
        body = self._clip(_numbered("\n".join(lines)))
        return f"Undid the last edit of {s.files.shown(rel)}:\n{body}"

    # ------------------------------------------------------------ helpers

    def _text(self, s: EditorSession, rel: str) -> str:
        kind = s.files.kind(rel)
        if kind == "dir":
            raise PathError(f"{s.files.shown(rel)} is a directory; view it, or give a file")
        if kind == "other":
            raise PathError(f"{s.files.shown(rel)} is not a regular file (a symlink?); refused")
        data = s.files.read(rel, max_bytes=self.max_file_bytes)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise PathError(f"{s.files.shown(rel)} is not UTF-8 text") from None

    def _save(self, s: EditorSession, rel: str, before: str, after: str) -> None:
        s.files.write(rel, after.encode())
        s.history.setdefault(rel, []).append(before.encode())

    def _snippet(
        self, s: EditorSession, rel: str, text: str, first: int, last: int, how: str
    ) -> str:
        lines, _ = _lines(text)
        start = max(1, first - _SNIPPET_LINES)
        end = min(len(lines), last + _SNIPPET_LINES)
        body = _numbered("\n".join(lines[start - 1 : end]), start)
        return (
            f"The file {s.files.shown(rel)} has been {how}. Lines {start}-{end} now read:\n"
            f"{self._clip(body)}\nReview the change; use undo_edit to revert it."
        )

    def _clip(self, body: str) -> str:
        if len(body) <= self.max_view_chars:
            return body
        return body[: self.max_view_chars].rsplit("\n", 1)[0] + "\n<response clipped>"
