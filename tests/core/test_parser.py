"""Tests for vt_envs.core.parser: known pairs for each grammar rule, then fuzzing."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vt_envs.core import parser as parser_module
from vt_envs.core.parser import INVALID_REASONS, ActionParser, ParseResult, ToolCall
from vt_envs.core.tool import Tool, ToolResult
from vt_envs.errors import InvalidConfigError


class _Stub(Tool):
    description = "test tool"

    async def call(self, session: Any, arguments: Any) -> ToolResult:  # pragma: no cover
        return ToolResult("")


class PythonTool(_Stub):
    name = "python"
    tag_argument = "code"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string"}},
        "required": ["code"],
        "additionalProperties": False,
    }


class SQLTool(_Stub):
    name = "sql"
    tag_argument = "query"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    }


class CropTool(_Stub):
    name = "crop"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }


TOOLS = (PythonTool(), SQLTool(), CropTool())


def make(**kwargs: Any) -> ActionParser:
    return ActionParser(TOOLS, **kwargs)


P = make()
BOXED = make(boxed_answers=True)
MULTI = make(max_calls=3)


def one_call(result: ParseResult) -> ToolCall:
    assert result.kind == "tool_call", result
    assert len(result.calls) == 1
    return result.calls[0]


def check_invariants(result: ParseResult, text: str) -> None:
    """The documented contract of a ParseResult for input ``text``."""
    assert isinstance(result, ParseResult)
    assert result.kind in ("tool_call", "answer", "invalid")
    if result.kind == "tool_call":
        assert result.calls and result.answer is None
        assert result.reason is None and result.message is None
        for call in result.calls:
            assert isinstance(call, ToolCall)
            assert call.raw in text
            assert call.style in ("tag", "json")
            assert isinstance(call.arguments, dict)
            assert call.name in {t.name for t in TOOLS}
            tag = call.name if call.style == "tag" else "tool_call"
            assert call.raw.startswith(f"<{tag}>") and call.raw.endswith(f"</{tag}>")
    elif result.kind == "answer":
        assert result.calls == () and result.reason is None and result.message is None
        assert isinstance(result.answer, str)
        assert result.answer and result.answer == result.answer.strip()
    else:
        assert result.calls == () and result.answer is None
        assert result.reason in INVALID_REASONS
        assert isinstance(result.message, str) and result.message
        assert len(result.message) < 2000  # policy text is clipped, never echoed whole
    json.dumps(result.to_info())


# ----------------------------------------------------------------- tag calls


def test_tag_call_maps_body_to_tag_argument() -> None:
    call = one_call(P.parse("<python>print(1)</python>"))
    assert call == ToolCall("python", {"code": "print(1)"}, "tag", "<python>print(1)</python>")
    call = one_call(P.parse("<sql>SELECT 1</sql>"))
    assert call.name == "sql" and call.arguments == {"query": "SELECT 1"}


def test_tag_body_trims_one_newline_each_side_and_keeps_indentation() -> None:
    text = "<python>\n\n    if x:\n        y = 1\n\n</python>"
    assert one_call(P.parse(text)).arguments == {"code": "\n    if x:\n        y = 1\n"}
    assert one_call(P.parse("<python>\r\n  x = 1\r\n</python>")).arguments == {"code": "  x = 1"}
    assert one_call(P.parse("<python>  x = 1  </python>")).arguments == {"code": "  x = 1  "}


def test_single_fenced_block_loses_its_fences() -> None:
    text = "<python>\n```python\ndef f():\n    return 1\n```\n</python>"
    assert one_call(P.parse(text)).arguments == {"code": "def f():\n    return 1"}
    assert one_call(P.parse("<sql>```\nSELECT 1\n```</sql>")).arguments == {"query": "SELECT 1"}


def test_two_fenced_blocks_or_inline_backticks_are_kept() -> None:
    two = "```python\na = 1\n```\n```python\nb = 2\n```"
    assert one_call(P.parse(f"<python>{two}</python>")).arguments == {"code": two}
    inline = "x = '```'"
    assert one_call(P.parse(f"<python>{inline}</python>")).arguments == {"code": inline}


def test_reasoning_text_around_a_call_is_ignored() -> None:
    text = "Let me think. I will compute it.\n<python>print(2 + 2)</python>\nthen answer"
    call = one_call(P.parse(text))
    assert call.arguments == {"code": "print(2 + 2)"}
    assert call.raw == "<python>print(2 + 2)</python>"


def test_nested_same_name_tags_pair_first_open_with_first_close() -> None:
    text = "<python>a<python>b</python>c</python>"
    assert one_call(P.parse(text)).arguments == {"code": "a<python>b"}


def test_tag_names_are_case_sensitive_and_spaces_break_them() -> None:
    for text in ("<Python>x</Python>", "< python >x</ python >", "<python >x</python >"):
        result = P.parse(text)
        assert result.kind == "invalid" and result.reason == "no_action", text


def test_json_only_tool_has_no_tag_form() -> None:
    result = P.parse('<crop>{"x": 1, "y": 2}</crop>')
    assert result.reason == "no_action"
    assert "<crop>" not in result.message
    assert "crop" in result.message  # listed among the JSON tools


def test_empty_tag_call() -> None:
    for text in ("<python></python>", "<python>\n  \n</python>", "<sql>\n</sql>"):
        assert P.parse(text).reason == "empty_call", text
    assert "<python>CODE</python>" in P.parse("<python></python>").message


# ---------------------------------------------------------------- JSON calls


def test_json_call_with_object_arguments() -> None:
    text = '<tool_call>\n{"name": "crop", "arguments": {"x": 3, "y": 4}}\n</tool_call>'
    assert one_call(P.parse(text)) == ToolCall("crop", {"x": 3, "y": 4}, "json", text)


def test_json_call_with_string_arguments() -> None:
    text = '<tool_call>{"name": "crop", "arguments": "{\\"x\\": 3, \\"y\\": 4}"}</tool_call>'
    assert one_call(P.parse(text)).arguments == {"x": 3, "y": 4}


def test_json_call_reaches_tag_tools_too() -> None:
    text = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    call = one_call(P.parse(text))
    assert (call.name, call.arguments, call.style) == ("python", {"code": "print(1)"}, "json")


def test_json_call_in_a_fence_and_parameters_alias() -> None:
    text = '<tool_call>```json\n{"name": "crop", "parameters": {"x": 1, "y": 2}}\n```</tool_call>'
    assert one_call(P.parse(text)).arguments == {"x": 1, "y": 2}


def test_unknown_tool_lists_valid_names_and_suggests() -> None:
    result = P.parse('<tool_call>{"name": "pyhton", "arguments": {"code": "1"}}</tool_call>')
    assert result.reason == "unknown_tool"
    assert "Did you mean 'python'?" in result.message
    assert "python, sql, crop" in result.message


def test_bad_json_reports_the_position() -> None:
    result = P.parse('<tool_call>{"name": "crop" "arguments": {}}</tool_call>')
    assert result.reason == "bad_json"
    assert "line 1 column 17 (char 16)" in result.message
    assert "<tool_call>" in result.message


def test_bad_json_shapes() -> None:
    for body in ('["crop"]', '{"arguments": {}}', '{"name": 3}', "[" * 100_000, "1" * 5000):
        result = P.parse(f"<tool_call>{body}</tool_call>")
        assert result.reason == "bad_json", body[:20]
    bad_string = '{"name": "crop", "arguments": "{x: 1}"}'
    result = P.parse(f"<tool_call>{bad_string}</tool_call>")
    assert result.reason == "bad_json" and '"arguments" string' in result.message


def test_bad_arguments_say_why_and_what_is_expected() -> None:
    result = P.parse('<tool_call>{"name": "crop", "arguments": {"x": "1", "y": 2}}</tool_call>')
    assert result.reason == "bad_arguments"
    assert "'x' must be integer, got str" in result.message
    assert "x (integer, required), y (integer, required)" in result.message
    result = P.parse('<tool_call>{"name": "crop", "arguments": [1, 2]}</tool_call>')
    assert result.reason == "bad_arguments" and "JSON object" in result.message


def test_missing_required_argument() -> None:
    result = P.parse('<tool_call>{"name": "crop", "arguments": {"x": 1}}</tool_call>')
    assert result.reason == "bad_arguments"
    assert "missing required argument(s): y" in result.message
    result = P.parse('<tool_call>{"name": "crop"}</tool_call>')
    assert result.reason == "bad_arguments" and "x, y" in result.message


def test_empty_json_call() -> None:
    assert P.parse("<tool_call>  \n </tool_call>").reason == "empty_call"


# ------------------------------------------------------------------- answers


def test_answer_is_stripped() -> None:
    result = P.parse("So the total is 5.\n<answer>\n  5 apples \n</answer>")
    assert (result.kind, result.answer) == ("answer", "5 apples")


def test_empty_answer() -> None:
    result = P.parse("<answer> \n </answer>")
    assert result.message == (
        "Your <answer> block is empty. Write your final answer inside it: <answer>ANSWER</answer>."
    )
    boxed = BOXED.parse(r"\boxed{ }")
    assert (boxed.reason, boxed.message) == (
        "empty_answer",
        r"Your \boxed{} answer is empty. Write your final answer inside it: \boxed{ANSWER}.",
    )


def test_custom_answer_tags() -> None:
    parser = make(answer_tags=("final", "answer"))
    assert parser.parse("<final>7</final>").answer == "7"
    assert parser.parse("<answer>8</answer>").answer == "8"


def test_boxed_answer_with_nested_braces_takes_the_last_balanced_one() -> None:
    assert BOXED.parse(r"so \boxed{\frac{1}{2}}").answer == r"\frac{1}{2}"
    assert BOXED.parse(r"\boxed{1} no, \boxed{2}.").answer == "2"
    assert BOXED.parse(r"\boxed{1} then \boxed{2 unclosed").answer == "1"
    assert BOXED.parse(r"\boxed{a{b}c{d{e}}}").answer == "a{b}c{d{e}}"
    assert BOXED.parse(r"}} \boxed{x} {").answer == "x"


def test_boxed_edge_cases() -> None:
    assert BOXED.parse(r"\boxed{ }").reason == "empty_answer"
    assert BOXED.parse(r"\boxed{\frac{1}{2}").reason == "no_action"
    assert BOXED.parse("\\boxed{").reason == "no_action"
    assert BOXED.parse("\\boxed{é\U0001f600}").answer == "é\U0001f600"
    assert BOXED.parse("\\boxed{\ud800}").answer == "\ud800"  # lone surrogate


def test_boxed_ignored_when_disabled() -> None:
    result = P.parse(r"The answer is \boxed{4}.")
    assert result.reason == "no_action"
    assert "boxed" not in result.message


def test_boxed_yields_to_any_tag_construct() -> None:
    assert BOXED.parse(r"\boxed{4} <answer>5</answer>").answer == "5"
    assert one_call(BOXED.parse(r"\boxed{4} <python>x</python>")).name == "python"
    assert BOXED.parse(r"\boxed{4} <python></python>").reason == "empty_call"
    # An unclosed tag is not a construct, so the boxed answer stands.
    assert BOXED.parse(r"\boxed{4} <python>x = ").answer == "4"


# ---------------------------------------------------------------- precedence


def test_earliest_complete_construct_decides() -> None:
    assert P.parse("<answer>5</answer> <python>x</python>").answer == "5"
    assert one_call(P.parse("<python>x</python> <answer>5</answer>")).name == "python"
    # A complete construct holding another: the outer one opens first.
    assert P.parse("<answer>use <python>x</python></answer>").answer == "use <python>x</python>"
    call = one_call(P.parse('<python>print("<answer>1</answer>")</python>'))
    assert call.arguments == {"code": 'print("<answer>1</answer>")'}


def test_unclosed_opening_is_skipped_when_something_else_completes() -> None:
    text = "I will answer in <answer> tags after <python>x = 1</python>"
    assert one_call(P.parse(text)).arguments == {"code": "x = 1"}


def test_unclosed_tag() -> None:
    result = P.parse("Let me run <python>\nx = 1\n")
    assert result.reason == "unclosed_tag"
    assert "<python> block was not closed with </python>" in result.message
    result = P.parse('<tool_call>{"name": "crop"')
    assert result.reason == "unclosed_tag"
    assert '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>' in result.message
    assert P.parse("<answer>5").reason == "unclosed_tag"
    # The first unclosed tag is the one reported.
    assert "<sql> block" in P.parse("<sql>SELECT <python>x <answer>5").message


def test_stray_closing_tag_is_no_action() -> None:
    assert P.parse("x = 1</python>").reason == "no_action"


def test_max_calls_one_takes_the_first_call() -> None:
    result = P.parse("<python>a</python><sql>b</sql><python>c</python>")
    assert one_call(result).arguments == {"code": "a"}
    # Later calls are not even parsed, so a broken second call does not matter.
    assert one_call(P.parse("<python>a</python><tool_call>{</tool_call>")).name == "python"


def test_max_calls_many_collects_in_order_until_an_answer() -> None:
    text = "<python>a</python> x <sql>b</sql> <answer>5</answer> <python>c</python>"
    result = MULTI.parse(text)
    assert [c.arguments for c in result.calls] == [{"code": "a"}, {"query": "b"}]
    text = "<python>a</python><python>b</python><python>c</python><python>d</python>"
    assert [c.arguments["code"] for c in MULTI.parse(text).calls] == ["a", "b", "c"]
    json_call = '<tool_call>{"name": "crop", "arguments": {"x": 1, "y": 2}}</tool_call>'
    result = MULTI.parse(f"<python>a</python>{json_call}")
    assert [(c.name, c.style) for c in result.calls] == [("python", "tag"), ("crop", "json")]


def test_max_calls_many_invalid_later_call_invalidates_the_action() -> None:
    result = MULTI.parse("<python>a</python><tool_call>{bad</tool_call>")
    assert result.reason == "bad_json"
    assert result.message.startswith("In tool call 2:")


def test_no_action_message_lists_the_accepted_forms() -> None:
    message = BOXED.parse("just thinking").message
    for form in ("<python>CODE</python>", "<sql>QUERY</sql>", "<tool_call>", "crop"):
        assert form in message
    assert "<answer>ANSWER</answer>" in message and "\\boxed{ANSWER}" in message
    message = ActionParser([PythonTool()], json_calls=False).parse("").message
    assert "<tool_call>" not in message and "<python>CODE</python>" in message


# --------------------------------------------------------- flags and config


def test_stop_strings() -> None:
    assert P.stop_strings == ("</python>", "</sql>", "</tool_call>", "</answer>")
    assert make(tag_calls=False).stop_strings == ("</tool_call>", "</answer>")
    parser = ActionParser([PythonTool()], json_calls=False, answer_tags=("final",))
    assert parser.stop_strings == ("</python>", "</final>")
    assert ActionParser([]).stop_strings == ("</answer>",)  # no tools: no <tool_call>


def test_disabled_forms_are_not_parsed() -> None:
    no_tags = make(tag_calls=False)
    assert no_tags.parse("<python>x</python>").reason == "no_action"
    no_json = ActionParser([PythonTool()], json_calls=False)
    text = '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'
    assert no_json.parse(text).reason == "no_action"


def test_to_info() -> None:
    assert P.parse("<python>x</python>").to_info() == {
        "kind": "tool_call",
        "tools": ["python"],
        "reason": None,
    }
    assert P.parse("nothing").to_info() == {"kind": "invalid", "tools": [], "reason": "no_action"}


def test_non_str_input_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        P.parse(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        P.parse(b"<answer>1</answer>")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tools": [PythonTool(), PythonTool()]}, "two tools are named 'python'"),
        ({"answer_tags": ("python",)}, "already the tag of tool 'python'"),
        ({"answer_tags": ("tool_call",)}, "already the JSON call tag"),
        ({"answer_tags": ("my answer",)}, "cannot be a tag name"),
        ({"answer_tags": "answer"}, "answer_tags=('answer',)"),
        ({"max_calls": 0}, "max_calls must be >= 1"),
        ({"tools": [CropTool()], "json_calls": False}, "only JSON calls reach it"),
        ({"tools": [], "answer_tags": ()}, "accepts no action"),
    ],
)
def test_config_errors(kwargs: dict[str, Any], needle: str) -> None:
    kwargs = dict(kwargs)
    tools = kwargs.pop("tools", TOOLS)
    with pytest.raises(InvalidConfigError, match=re.escape(needle)):
        ActionParser(tools, **kwargs)


def test_tag_tool_whose_schema_needs_more_than_the_tag_argument_is_rejected() -> None:
    class TwoArgs(_Stub):
        name = "grep"
        tag_argument = "pattern"
        parameters: ClassVar[dict[str, Any]] = {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern", "path"],
        }

    with pytest.raises(InvalidConfigError, match="requires path"):
        ActionParser([TwoArgs()])
    ActionParser([TwoArgs()], tag_calls=False)  # JSON calls can pass both


def test_result_invariants_are_enforced() -> None:
    with pytest.raises(ValueError):
        ParseResult("tool_call")
    with pytest.raises(ValueError):
        ParseResult("invalid", reason="nope", message="m")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ParseResult("answer", answer="")


# ------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = [
    "<python>",
    "</python>",
    "<sql>",
    "</sql>",
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<crop>",
    "</crop>",
    "<foo>",
    "</foo>",
    "<Python>",
    "< python >",
    "<",
    ">",
    "</",
    "{",
    "}",
    "[",
    "]",
    '"',
    "'",
    ":",
    ",",
    "\\",
    "\n",
    "```",
    "```python\n",
    "\\boxed{",
    '{"name": "crop", "arguments": {"x": 1, "y": 2}}',
    '{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}',
    '"name"',
    '"arguments"',
    "crop",
    "python",
    "1",
    "\ud800",  # a lone surrogate is a valid Python str
]
fragment_text = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40
).map("".join)
parsers = st.sampled_from(
    [
        P,
        BOXED,
        MULTI,
        make(tag_calls=False),
        ActionParser(
            [PythonTool(), SQLTool()],
            json_calls=False,
            answer_tags=("answer", "final"),
            boxed_answers=True,
        ),
    ]
)


@FUZZ
@given(st.text(), parsers)
def test_fuzz_arbitrary_unicode(text: str, parser: ActionParser) -> None:
    check_invariants(parser.parse(text), text)


@FUZZ
@given(fragment_text, parsers)
def test_fuzz_tag_grammar_fragments(text: str, parser: ActionParser) -> None:
    check_invariants(parser.parse(text), text)


@FUZZ
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join))
def test_fuzz_fragments_only_agree_across_max_calls(text: str) -> None:
    single, multi = P.parse(text), MULTI.parse(text)
    check_invariants(single, text)
    check_invariants(multi, text)
    # More allowed calls never change what the first construct was.
    assert single.kind == multi.kind or (single.kind == "tool_call" and multi.kind == "invalid")
    if multi.kind == "tool_call":
        assert multi.calls[0] == single.calls[0]


PROSE = st.text(st.characters(blacklist_characters="<\\"), max_size=200)


@FUZZ
@given(PROSE, st.sampled_from(range(5)), PROSE)
def test_fuzz_prose_around_a_valid_action_changes_nothing(before: str, i: int, after: str) -> None:
    action = VALID_ACTIONS[i]
    assert P.parse(before + action + after) == P.parse(action)


VALID_ACTIONS = [
    "<python>\n    x = 1\n</python>",
    "<sql>SELECT 1</sql>",
    '<tool_call>{"name": "crop", "arguments": {"x": 1, "y": 2}}</tool_call>',
    '<tool_call>{"name": "crop", "arguments": "{\\"x\\": 1, \\"y\\": 2}"}</tool_call>',
    "<answer>42</answer>",
]


@pytest.mark.parametrize("action", VALID_ACTIONS)
def test_every_truncation_of_a_valid_action(action: str) -> None:
    full = P.parse("reasoning " + action)
    assert full.kind in ("tool_call", "answer")
    for cut in range(len(action)):
        text = "reasoning " + action[:cut]
        result = P.parse(text)
        check_invariants(result, text)
        assert result.kind == "invalid", text  # nothing is complete before the last ">"
        opened = cut >= action.index(">") + 1
        assert result.reason == ("unclosed_tag" if opened else "no_action"), text


def test_every_truncation_of_a_boxed_answer() -> None:
    action = r"\boxed{\frac{1}{2}}"
    for cut in range(len(action)):
        result = BOXED.parse(action[:cut])
        check_invariants(result, action[:cut])
        assert result.reason == "no_action"
    assert BOXED.parse(action).answer == r"\frac{1}{2}"


# -------------------------------------------------------------- huge inputs


def test_huge_nested_openings() -> None:
    text = "<python>" * 200_000
    assert P.parse(text).reason == "unclosed_tag"
    result = P.parse(text + "x</python>")
    assert one_call(result).arguments == {"code": "<python>" * 199_999 + "x"}
    text = "<answer><python>" * 100_000
    assert MULTI.parse(text).reason == "unclosed_tag"


def test_huge_braces() -> None:
    braces = "{" * 1_000_000
    assert BOXED.parse(braces).reason == "no_action"
    assert BOXED.parse("\\boxed{" + braces).reason == "no_action"
    assert BOXED.parse("\\boxed{" * 150_000).reason == "no_action"
    assert BOXED.parse("\\boxed{" * 100_000 + "}").reason == "empty_answer"
    result = BOXED.parse("\\boxed{" * 100_000 + "7}")
    assert result.answer == "7"
    text = f"<tool_call>{braces}</tool_call>"
    result = P.parse(text)
    assert result.reason == "bad_json"
    check_invariants(result, text)


def test_huge_junk_and_long_names_keep_messages_short() -> None:
    name = "x" * 1_000_000
    result = P.parse(f'<tool_call>{{"name": "{name}"}}</tool_call>')
    assert result.reason == "unknown_tool" and len(result.message) < 400
    value = "v" * 1_000_000
    args = json.dumps({"name": "crop", "arguments": {"x": value, "y": 1}})
    result = P.parse(f"<tool_call>{args}</tool_call>")
    assert result.reason == "bad_arguments" and len(result.message) < 400
    junk = '<<</ <tool_call <answer </answer <python \\boxed{ ]}{"' * 20_000
    check_invariants(BOXED.parse(junk), junk)


def test_module_exports() -> None:
    for name in parser_module.__all__:
        assert hasattr(parser_module, name)
    assert set(INVALID_REASONS) == {
        "no_action",
        "unclosed_tag",
        "empty_answer",
        "bad_json",
        "unknown_tool",
        "bad_arguments",
        "too_many_calls",
        "empty_call",
    }
