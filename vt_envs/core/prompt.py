"""The system prompt: domain instructions plus how to call each tool.

Two action formats are described to the agent; the parser accepts both
regardless, so a policy trained on one still works if it drifts:

- ``"tags"``: ``<python>code</python>`` for each tool with a tag argument
  (JSON-only tools are listed with the ``<tool_call>`` form);
- ``"json"``: Hermes/Qwen style ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  with the tool specs listed in a ``<tools>`` block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from vt_envs.core.tool import Tool
from vt_envs.errors import InvalidConfigError

__all__ = ["ACTION_FORMATS", "render_system_prompt"]

ACTION_FORMATS = ("tags", "json")


def _tag_example(tool: Tool) -> str:
    return f"<{tool.name}>{tool.tag_argument.upper()}</{tool.name}>"


def _json_example(tool: Tool) -> str:
    args = {name: name.upper() for name in tool.parameters.get("properties", {})}
    return "<tool_call>" + json.dumps({"name": tool.name, "arguments": args}) + "</tool_call>"


def render_system_prompt(
    instructions: str,
    tools: Sequence[Tool],
    *,
    action_format: str = "tags",
    answer_tag: str = "answer",
    extra_answer_forms: Sequence[str] = (),
    calls_per_turn: int = 1,
    list_tools: bool = True,
) -> str:
    """Render the system prompt for ``tools`` in ``action_format``.

    ``instructions`` is the domain's own text (what the task is, what counts
    as an answer). ``calls_per_turn`` is how many calls one turn may make.
    ``list_tools=False`` leaves the tool list out (the chat template renders
    it from ``tools=``). The result ends with how to give the final answer.
    """
    if action_format not in ACTION_FORMATS:
        raise InvalidConfigError(
            f"action_format must be one of {ACTION_FORMATS}, got {action_format!r}"
        )
    per_turn = (
        "one call per turn" if calls_per_turn == 1 else f"up to {calls_per_turn} calls per turn"
    )
    parts = [instructions.strip()]
    if tools and not list_tools:
        parts.append(f"Make {per_turn}; after a call you will see its output.")
    elif tools:
        if action_format == "tags":
            lines = [f"You can use these tools, {per_turn}:"]
            for tool in tools:
                form = _tag_example(tool) if tool.tag_argument else _json_example(tool)
                lines.append(f"- {tool.name}: {tool.description.strip()} Call: {form}")
            parts.append("\n".join(lines))
        else:
            specs = "\n".join(json.dumps(tool.spec()) for tool in tools)
            parts.append(
                f"You can call these functions, {per_turn}:\n<tools>\n"
                f"{specs}\n</tools>\n"
                'Call one as <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.'
            )
        if calls_per_turn > 1:
            parts.append("Calls in one turn run in the order you write them.")
        parts.append("After a call you will see its output. ")
    answer = f"<{answer_tag}>ANSWER</{answer_tag}>"
    forms = " or ".join([answer, *extra_answer_forms])
    parts.append(f"When you are done, give the final answer as {forms}.")
    return "\n\n".join(p.strip() for p in parts if p.strip())
