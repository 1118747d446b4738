"""Worked examples: short demonstration episodes placed before the task.

A pretrained instruct model reads a tool-use format far more reliably from a
demonstration than from a description. Measured with SmolLM2-135M-Instruct
on VT-Lookup-v0 (greedy, 10 held-out tasks): the format described in the
system prompt, with or without a worked example written into that text, gave
0/10 valid tool calls; one demonstration as real chat turns gave the answer
format but skipped the tool; two demonstrations as chat turns gave 10/10
valid calls and 10/10 correct answers. So an env's prompt is::

    system: instructions + tools + answer format
    user: example question 1     assistant: call   tool: output   assistant: answer
    user: example question 2     ...
    user: the task

The demonstrations are rendered in the env's own formats (tag or
``<tool_call>`` JSON calls, chat or inline observations, its answer tag) and
parsed back with the env's own parser when the env is built, so an example
can never teach an action the env would reject. They are part of the prompt
(they count toward ``max_episode_tokens``); the task, the verifier and the
reward do not change. ``examples=()`` turns them off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vt_envs.core.parser import ActionParser
from vt_envs.core.tool import Tool
from vt_envs.errors import InvalidConfigError

__all__ = ["ExampleCall", "WorkedExample", "coerce_examples", "render_examples"]


@dataclass(frozen=True)
class ExampleCall:
    """One tool call of a demonstration and the output the tool gives for it.

    ``output`` must be what the real tool returns for ``arguments`` (each
    domain's tests run its examples' calls through the tool to check it).
    """

    tool: str
    arguments: Mapping[str, Any]
    output: str


@dataclass(frozen=True)
class WorkedExample:
    """A demonstration episode: a question, the calls that answer it, the answer."""

    question: str
    calls: Sequence[ExampleCall] = field(default_factory=tuple)
    answer: str = ""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> WorkedExample:
        """From ``{"question", "calls": [{"tool", "arguments", "output"}], "answer"}`` (YAML)."""
        unknown = set(data) - {"question", "calls", "answer"}
        if unknown or "question" not in data or "answer" not in data:
            raise InvalidConfigError(
                "a worked example needs the keys question, answer and optionally calls "
                f"(each with tool, arguments, output); got {sorted(data)}"
            )
        calls = []
        for call in data.get("calls") or ():
            if not isinstance(call, Mapping) or set(call) != {"tool", "arguments", "output"}:
                raise InvalidConfigError(
                    "each call of a worked example needs exactly the keys tool, arguments "
                    f"and output; got {call!r}"
                )
            calls.append(
                ExampleCall(str(call["tool"]), dict(call["arguments"]), str(call["output"]))
            )
        return cls(str(data["question"]), tuple(calls), str(data["answer"]))


def coerce_examples(examples: Any) -> tuple[WorkedExample, ...]:
    """``examples=`` as given (``None``, examples, or their mappings) → a tuple of examples."""
    if examples is None:
        return ()
    if isinstance(examples, (WorkedExample, Mapping, str)):
        raise InvalidConfigError(
            f"examples must be a list of worked examples (or [] for none), got {examples!r:.80}"
        )
    out = []
    for example in examples:
        if isinstance(example, Mapping):
            example = WorkedExample.from_mapping(example)
        if not isinstance(example, WorkedExample):
            raise InvalidConfigError(
                f"examples must hold WorkedExample objects or mappings, got {example!r:.80}"
            )
        out.append(example)
    return tuple(out)


def _render_call(call: ExampleCall, tool: Tool, action_format: str) -> str:
    if action_format == "tags" and tool.tag_argument and set(call.arguments) == {tool.tag_argument}:
        body = str(call.arguments[tool.tag_argument])
        if "\n" in body:  # code reads better on its own lines; the parser drops these two
            body = f"\n{body}\n"
        return f"<{tool.name}>{body}</{tool.name}>"
    payload = {"name": tool.name, "arguments": dict(call.arguments)}
    return f"<tool_call>{json.dumps(payload)}</tool_call>"


def render_examples(
    examples: Sequence[WorkedExample],
    *,
    tools: Mapping[str, Tool],
    parser: ActionParser,
    action_format: str,
    observation_format: str,
    inline_template: str,
    answer_tag: str,
    observation_role: str = "tool",
) -> list[dict[str, str]]:
    """The chat messages of ``examples``, in the env's formats, each action checked.

    ``chat``: an assistant message per action and an ``observation_role``
    message per output; ``inline``: one assistant message holding the calls,
    their outputs through ``inline_template`` and the answer, as an inline
    episode's assistant turn reads. Raises :class:`InvalidConfigError` when an
    example names a tool the env lacks, or an action does not parse back to
    the same call (or answer) with ``parser``.
    """
    messages: list[dict[str, str]] = []
    for number, example in enumerate(examples, 1):
        where = f"worked example {number} ({example.question[:40]!r})"
        messages.append({"role": "user", "content": example.question})
        inline = ""
        for call in example.calls:
            tool = tools.get(call.tool)
            if tool is None:
                raise InvalidConfigError(
                    f"{where} calls {call.tool!r}, not a tool of this env ({sorted(tools)}); "
                    "fix the example or pass examples=[]"
                )
            action = _render_call(call, tool, action_format)
            parsed = parser.parse(action)
            if (
                parsed.kind != "tool_call"
                or len(parsed.calls) != 1
                or parsed.calls[0].name != call.tool
                or dict(parsed.calls[0].arguments) != dict(call.arguments)
            ):
                raise InvalidConfigError(
                    f"{where}: the call {action!r} does not parse back as given "
                    f"(parsed: {parsed.kind}, {parsed.message or parsed.calls}); "
                    "check its arguments against the tool's parameters"
                )
            if observation_format == "inline":
                inline += action + inline_template.format(text=call.output)
            else:
                messages.append({"role": "assistant", "content": action})
                messages.append({"role": observation_role, "content": call.output})
        answer = f"<{answer_tag}>{example.answer}</{answer_tag}>"
        parsed = parser.parse(answer)
        if parsed.kind != "answer" or parsed.answer != example.answer.strip():
            raise InvalidConfigError(
                f"{where}: the answer {answer!r} does not parse back as an answer "
                f"({parsed.kind}: {parsed.message})"
            )
        messages.append({"role": "assistant", "content": inline + answer})
    return messages
