"""The action parser: the text a policy generated in one turn → a typed result.

:meth:`ActionParser.parse` turns one turn of policy text into a
:class:`ParseResult` that is a tool call, a final answer, or an invalid
action with a reason and a message the agent reads. It is pure, never raises
for any ``str`` (policy mistakes are data, see ``vt_envs.errors``), and runs
in linear time: tags are found with one alternation of literal names, and
braces of ``\\boxed{...}`` are matched with prefix sums, so megabytes of
nested or unclosed tags cannot make it backtrack.

Grammar (names are case-sensitive; ``< python >`` is not a tag):

- Tag call ``<NAME>BODY</NAME>`` for each tool with a ``tag_argument``
  (when ``tag_calls``): ``{tag_argument: BODY}``. One leading and one
  trailing newline of BODY are removed, nothing else, so indentation is kept;
  a BODY that is exactly one Markdown fenced block loses its fences.
- JSON call ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (Hermes / Qwen; when ``json_calls``). ``arguments`` may be a JSON string
  holding an object (OpenAI style); a missing ``arguments`` (or the key
  ``parameters`` used instead) is accepted.
- Answer ``<TAG>TEXT</TAG>`` for each answer tag; the answer is TEXT stripped.
- With ``boxed_answers``, the last ``\\boxed{...}`` whose braces balance, used
  only when the text holds no complete tag construct at all.

Precedence. Text is scanned left to right; an opening tag pairs with the
first closing tag of the same name after it, and an opening tag that is
never closed is skipped (it may be prose: "I will answer in <answer> tags").
The complete construct that *opens* first decides the kind. If it is a tool
call, the parser keeps collecting complete calls after it, in order, until
it has ``max_calls`` of them or meets an answer; further calls are ignored,
not rejected, because a policy that stops at the first closing tag (see
:attr:`ActionParser.stop_strings`) never writes them. So ``"too_many_calls"``
is a reason the env may use, but this parser never returns it. If any
collected call is invalid, the whole action is invalid (no call runs). With
no complete construct: a balanced ``\\boxed{}`` (if enabled) is the answer,
else an unclosed opening tag gives ``"unclosed_tag"``, else ``"no_action"``.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from vt_envs.core.tool import Tool, validate_arguments
from vt_envs.errors import InvalidConfigError, did_you_mean

__all__ = ["INVALID_REASONS", "JSON_CALL_TAG", "ActionParser", "ParseResult", "ToolCall"]

JSON_CALL_TAG = "tool_call"

InvalidReason = Literal[
    "no_action",
    "unclosed_tag",
    "empty_answer",
    "bad_json",
    "unknown_tool",
    "bad_arguments",
    "too_many_calls",
    "empty_call",
]
INVALID_REASONS: tuple[str, ...] = get_args(InvalidReason)

# Tag names must not contain "<", ">", "/" or whitespace, or the grammar breaks.
_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")
_BOXED = re.compile(r"\\boxed\{")
_FENCE = "```"
_CLIP = 200  # longest piece of policy text quoted back in a message


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: the tool's name.
        arguments: the call's arguments, already valid for the tool's schema.
        style: ``"tag"`` for ``<NAME>...</NAME>``, ``"json"`` for ``<tool_call>``.
        raw: the exact substring of the action that made this call, from its
            opening ``<`` to the end of its closing tag.
    """

    name: str
    arguments: dict[str, Any]
    style: Literal["tag", "json"]
    raw: str


@dataclass(frozen=True)
class ParseResult:
    """What one turn of policy text means.

    Attributes:
        kind: ``"tool_call"``, ``"answer"`` or ``"invalid"``.
        calls: the calls to run, in order; non-empty iff ``kind == "tool_call"``.
        answer: the stripped, non-empty answer text iff ``kind == "answer"``.
        reason: iff ``kind == "invalid"``, one of :data:`INVALID_REASONS`.
        message: iff ``kind == "invalid"``, one or two sentences for the agent
            saying what was wrong and which format to use.
    """

    kind: Literal["tool_call", "answer", "invalid"]
    calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    reason: InvalidReason | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        # The env relies on these invariants; break them loudly (a VT bug).
        kind = self.kind
        is_call, is_answer, is_invalid = kind == "tool_call", kind == "answer", kind == "invalid"
        if not (is_call or is_answer or is_invalid):
            raise ValueError(f"unknown ParseResult kind {self.kind!r}")
        if bool(self.calls) != is_call:
            raise ValueError(f"calls must be non-empty iff kind == 'tool_call' ({self.kind!r})")
        if (self.answer is not None) != is_answer or (is_answer and not self.answer):
            raise ValueError(f"answer must be a non-empty str iff kind == 'answer' ({self.kind!r})")
        if is_invalid != (self.reason in INVALID_REASONS) or (self.message is None) == is_invalid:
            raise ValueError(f"reason and message must be set iff kind == 'invalid' ({self})")

    def to_info(self) -> dict[str, Any]:
        """A JSON-friendly summary for ``info["parse"]``: kind, tool names, reason."""
        return {"kind": self.kind, "tools": [c.name for c in self.calls], "reason": self.reason}


def _invalid(reason: InvalidReason, message: str) -> ParseResult:
    return ParseResult("invalid", reason=reason, message=message)


class ActionParser:
    """Parses policy text for one env's tools (see the module docstring for the grammar).

    Args:
        tools: the env's tools; each is callable with JSON, and also with a
            tag when it has a ``tag_argument``.
        answer_tags: tag names that hold the final answer.
        boxed_answers: also accept the last balanced ``\\boxed{...}`` as the
            answer when no tag construct is present (math benchmarks).
        tag_calls: accept ``<NAME>BODY</NAME>`` calls.
        json_calls: accept ``<tool_call>{...}</tool_call>`` calls.
        max_calls: the most calls one action runs; later ones are ignored.

    Raises:
        InvalidConfigError: on duplicate or clashing names, a name that cannot
            be a tag, a tool no enabled form can call, ``max_calls < 1``, or a
            parser that accepts nothing.

    Attributes:
        stop_strings: closing tags at which a policy should stop generating
            so the env can act: ``</NAME>`` per tag-callable tool (when
            ``tag_calls``), ``</tool_call>`` (when ``json_calls`` and there are
            tools), and
            ``</TAG>`` per answer tag. The policy must keep the stop string in
            its output (vLLM: ``include_stop_str_in_output=True``), or the
            parser sees an unclosed tag.
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        answer_tags: Sequence[str] = ("answer",),
        boxed_answers: bool = False,
        tag_calls: bool = True,
        json_calls: bool = True,
        max_calls: int = 1,
    ):
        if isinstance(answer_tags, str):
            raise InvalidConfigError(
                f"answer_tags must be a sequence of tag names, got the string {answer_tags!r}; "
                f"write answer_tags=({answer_tags!r},)"
            )
        if max_calls < 1:
            raise InvalidConfigError(f"max_calls must be >= 1, got {max_calls!r}")
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise InvalidConfigError(
                    f"two tools are named {tool.name!r}; tool names must be unique"
                )
            self.tools[tool.name] = tool
        self.answer_tags = tuple(answer_tags)
        self.boxed_answers = bool(boxed_answers)
        self.tag_calls = bool(tag_calls)
        # Without tools, <tool_call> could only ever be "unknown_tool": not a form at all.
        self.json_calls = bool(json_calls) and bool(self.tools)
        self.max_calls = int(max_calls)
        self._tag_tools = {
            name: tool for name, tool in self.tools.items() if tag_calls and tool.tag_argument
        }
        self._check_config()

        names = [*self._tag_tools, *([JSON_CALL_TAG] if self.json_calls else []), *self.answer_tags]
        self._tag_names = names
        # One alternation of literal names: linear time, no backtracking.
        alternation = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
        self._tag_re = re.compile(f"<(/?)({alternation})>") if names else None
        self.stop_strings: tuple[str, ...] = tuple(f"</{name}>" for name in names)
        self._no_action_message = self._describe_forms()

    def _check_config(self) -> None:
        claimed: dict[str, str] = {}
        for name in self._tag_tools:
            claimed[name] = f"the tag of tool {name!r}"
        if self.json_calls:
            if JSON_CALL_TAG in claimed:
                raise InvalidConfigError(
                    f"tool {JSON_CALL_TAG!r} clashes with the JSON call tag <{JSON_CALL_TAG}>; "
                    "rename the tool or pass json_calls=False"
                )
            claimed[JSON_CALL_TAG] = "the JSON call tag"
        for tag in self.answer_tags:
            if tag in claimed:
                raise InvalidConfigError(
                    f"answer tag {tag!r} is already {claimed[tag]}; choose another answer tag"
                )
            claimed[tag] = "an answer tag"
        for name, role in claimed.items():
            if not _TAG_NAME.fullmatch(name):
                raise InvalidConfigError(
                    f"{name!r} cannot be a tag name (it is {role}); "
                    "use letters, digits, '_', '.', ':' or '-', starting with a letter or '_'"
                )
        for name in self.tools:
            if not self.json_calls and name not in self._tag_tools:
                raise InvalidConfigError(
                    f"tool {name!r} has no tag_argument, so only JSON calls reach it, "
                    "but json_calls=False; enable json_calls or give the tool a tag_argument"
                )
        for name, tool in self._tag_tools.items():
            schema = tool.parameters
            others = [k for k in schema.get("required", []) if k != tool.tag_argument]
            # A schema without "properties" accepts any key, so only a declared list can lack it.
            missing = "properties" in schema and tool.tag_argument not in schema["properties"]
            if others or missing:
                raise InvalidConfigError(
                    f"tool {name!r} has tag_argument={tool.tag_argument!r}, but its schema "
                    f"{'requires ' + ', '.join(others) if others else 'lacks that property'}, "
                    "so no tag call could be valid; fix the schema or set tag_argument=None"
                )
        if not claimed and not self.boxed_answers:
            raise InvalidConfigError(
                "this ActionParser accepts no action: "
                "give it tools, answer_tags or boxed_answers=True"
            )

    def _describe_forms(self) -> str:
        """The 'no_action' message: every form this parser accepts, for the agent."""
        call_forms = [self._example(name) for name in self._tag_tools]
        if self.json_calls:
            call_forms.append(f"{self._example(JSON_CALL_TAG)} (tools: {', '.join(self.tools)})")
        answer_forms = [self._example(tag) for tag in self.answer_tags]
        if self.boxed_answers:
            answer_forms.append("\\boxed{ANSWER}")
        parts = []
        if call_forms:
            parts.append(f"to call a tool, write {' or '.join(call_forms)}")
        if answer_forms:
            parts.append(f"to give your final answer, write {' or '.join(answer_forms)}")
        found = " or ".join(
            (["tool call"] if call_forms else []) + (["final answer"] if answer_forms else [])
        )
        return f"No {found} found. {_sentence('; '.join(parts))}."

    # ------------------------------------------------------------------ parse

    def parse(self, text: str) -> ParseResult:
        """Parse one turn of policy text. Never raises for a ``str``.

        Raises:
            TypeError: if ``text`` is not a ``str`` (a developer error).
        """
        if not isinstance(text, str):
            raise TypeError(f"ActionParser.parse expects str, got {type(text).__name__}")
        result, unclosed = self._scan_tags(text)
        if result is not None:
            return result
        if self.boxed_answers:
            boxed = _last_boxed(text)
            if boxed is not None:
                return self._answer(boxed, None)
        if unclosed is not None:
            return _invalid(
                "unclosed_tag",
                f"Your <{unclosed}> block was not closed with </{unclosed}>. "
                f"Write {self._example(unclosed)}.",
            )
        return _invalid("no_action", self._no_action_message)

    def _example(self, tag: str) -> str:
        """The complete form of ``tag`` with a placeholder body, for messages."""
        if tag in self._tag_tools:
            body = str(self._tag_tools[tag].tag_argument).upper()
        elif tag == JSON_CALL_TAG:
            body = '{"name": "TOOL", "arguments": {...}}'
        else:
            body = "ANSWER"
        return f"<{tag}>{body}</{tag}>"

    def _scan_tags(self, text: str) -> tuple[ParseResult | None, str | None]:
        """Pair tags left to right; returns (result or None, first unclosed tag name)."""
        if self._tag_re is None:
            return None, None
        openings: list[tuple[int, int, str]] = []
        closings: dict[str, list[int]] = {name: [] for name in self._tag_names}
        for m in self._tag_re.finditer(text):
            if m.group(1):
                closings[m.group(2)].append(m.start())
            else:
                openings.append((m.start(), m.end(), m.group(2)))

        calls: list[ToolCall] = []
        cursor, unclosed = 0, None
        for start, body_start, name in openings:
            if start < cursor:  # inside a call already taken
                continue
            ends = closings[name]
            i = bisect_left(ends, body_start)
            if i == len(ends):
                unclosed = unclosed or name
                continue
            body_end = ends[i]
            end = body_end + len(name) + 3  # len("</" + name + ">")
            body, raw = text[body_start:body_end], text[start:end]
            if name in self.answer_tags:
                if calls:  # calls come first; the answer waits for their results
                    break
                return self._answer(body, name), None
            call = (
                self._json_call(body, raw)
                if name == JSON_CALL_TAG
                else self._tag_call(name, body, raw)
            )
            if isinstance(call, ParseResult):
                if calls:
                    call = _invalid(call.reason, f"In tool call {len(calls) + 1}: {call.message}")
                return call, None
            calls.append(call)
            cursor = end
            if len(calls) == self.max_calls:
                break
        if calls:
            return ParseResult("tool_call", calls=tuple(calls)), None
        return None, unclosed

    def _answer(self, body: str, tag: str | None) -> ParseResult:
        """The answer in ``body``, given in ``tag`` (``None``: ``\\boxed{}``)."""
        answer = body.strip()
        if answer:
            return ParseResult("answer", answer=answer)
        if tag is None:
            form, example = "\\boxed{} answer", "\\boxed{ANSWER}"
        else:
            form, example = f"<{tag}> block", self._example(tag)
        return _invalid(
            "empty_answer", f"Your {form} is empty. Write your final answer inside it: {example}."
        )

    def _tag_call(self, name: str, body: str, raw: str) -> ToolCall | ParseResult:
        tool = self._tag_tools[name]
        body = _unfence(_trim_one_newline(body))
        if not body.strip():
            return _invalid(
                "empty_call", f"Your <{name}> block is empty. Write {self._example(name)}."
            )
        return self._validated(tool, {tool.tag_argument: body}, "tag", raw)

    def _json_call(self, body: str, raw: str) -> ToolCall | ParseResult:
        body = _unfence(body.strip()).strip()
        usage = f"Write {self._example(JSON_CALL_TAG)}."
        if not body:
            return _invalid("empty_call", f"Your <{JSON_CALL_TAG}> block is empty. {usage}")
        payload, error = _loads(body)
        if error is not None:
            return _invalid(
                "bad_json", f"The JSON in <{JSON_CALL_TAG}> is invalid: {error}. {usage}"
            )
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return _invalid(
                "bad_json",
                f'The JSON in <{JSON_CALL_TAG}> must be an object with a string "name". {usage}',
            )
        name = payload["name"]
        tool = self.tools.get(name)
        if tool is None:
            hint = did_you_mean(name, self.tools) if len(name) <= 100 else ""
            return _invalid(
                "unknown_tool",
                f"Unknown tool {_clip(name)!r}.{hint} "
                f"Available tools: {', '.join(self.tools) or '(none)'}.",
            )
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI style: the arguments object as a JSON string
            arguments, error = _loads(arguments) if arguments.strip() else ({}, None)
            if error is not None:
                return _invalid(
                    "bad_json",
                    f'The "arguments" string of your {name!r} call is not valid JSON: {error}. '
                    f'Give "arguments" as a JSON object.',
                )
        return self._validated(tool, arguments, "json", raw)

    def _validated(
        self, tool: Tool, arguments: Any, style: str, raw: str
    ) -> ToolCall | ParseResult:
        problem = validate_arguments(tool.parameters, arguments)
        if problem is not None:
            return _invalid(
                "bad_arguments",
                f"Invalid arguments for tool {tool.name!r}: {_clip(problem)}. "
                f"Expected {_signature(tool.parameters)}.",
            )
        return ToolCall(tool.name, dict(arguments), style, raw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- helpers


def _sentence(text: str) -> str:
    """Upper-case the first letter only (``str.capitalize`` lowers the rest)."""
    return text[:1].upper() + text[1:]


def _clip(text: str, limit: int = _CLIP) -> str:
    """Keep messages short: policy text quoted back is cut to ``limit`` chars."""
    return text if len(text) <= limit else text[:limit] + "..."


def _loads(text: str) -> tuple[Any, str | None]:
    """``json.loads`` that returns ``(value, None)`` or ``(None, error)``; never raises."""
    try:
        return json.loads(text), None
    except RecursionError:  # deeply nested policy text
        return None, "it is nested too deeply"
    except ValueError as exc:  # JSONDecodeError (with its position), or an over-long int
        return None, _clip(str(exc))


def _trim_one_newline(body: str) -> str:
    """Remove one leading and one trailing newline; keep all other whitespace."""
    for newline in ("\r\n", "\n"):
        if body.startswith(newline):
            body = body[len(newline) :]
            break
    for newline in ("\r\n", "\n"):
        if body.endswith(newline):
            body = body[: -len(newline)]
            break
    return body


def _unfence(body: str) -> str:
    """If ``body`` is exactly one Markdown fenced block (```lang ... ```), return its content."""
    stripped = body.strip()
    if len(stripped) < 2 * len(_FENCE) or not (
        stripped.startswith(_FENCE) and stripped.endswith(_FENCE)
    ):
        return body
    first_newline = stripped.find("\n")
    if first_newline == -1 or first_newline > len(stripped) - len(_FENCE):
        return body
    info = stripped[len(_FENCE) : first_newline]  # the language tag, e.g. "python"
    content = stripped[first_newline + 1 : -len(_FENCE)]
    if "`" in info or _FENCE in content:  # not a single block
        return body
    return content.removesuffix("\n")


def _signature(schema: dict[str, Any]) -> str:
    """``arguments x (integer, required), y (integer)`` from a JSON schema, for messages."""
    properties = schema.get("properties", {})
    if not properties:
        return "a JSON object of arguments"
    required = set(schema.get("required", []))
    parts = []
    for key, prop in properties.items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        kind = " or ".join(kind) if isinstance(kind, list) else str(kind)
        parts.append(f"{key} ({kind}{', required' if key in required else ''})")
    return "arguments " + ", ".join(parts)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{`` whose brace is closed, or ``None``.

    Linear time: with ``depth[i]`` the brace depth after character ``i``, the
    brace at ``p`` is closed iff the depth later falls back to ``depth[p] - 1``,
    and its closing brace is the first index where it does. A suffix minimum
    answers the first question for every ``\\boxed{`` at once.
    """
    first = text.find("\\boxed{")
    if first == -1:
        return None
    text = text[first:]
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    depth = np.cumsum((codes == ord("{")).astype(np.int64) - (codes == ord("}")))
    braces = np.fromiter((m.end() - 1 for m in _BOXED.finditer(text)), dtype=np.int64)
    # suffix_min[i] = min(depth[i:]); the sentinel makes a brace at the very end unclosed.
    suffix_min = np.append(np.minimum.accumulate(depth[::-1])[::-1], np.iinfo(np.int64).max)
    outer = depth[braces] - 1
    closed = np.flatnonzero(suffix_min[braces + 1] <= outer)
    if closed.size == 0:
        return None
    brace, level = int(braces[closed[-1]]), int(outer[closed[-1]])
    close = brace + 1 + int(np.argmax(depth[brace + 1 :] <= level))
    return text[brace + 1 : close]
