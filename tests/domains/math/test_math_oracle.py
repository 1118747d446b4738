"""The oracle's code and answer reading, and the no-tool baseline (no sandbox needed)."""

from __future__ import annotations

import contextlib
import io

import pytest

from vt_envs.core.task import Task
from vt_envs.domains.math.generator import math_tasks
from vt_envs.domains.math.oracle import MathNoToolPolicy, oracle_code, read_marked_answer


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # project-written oracle code
    return out.getvalue()


def test_oracle_code_prints_the_marked_answer_of_embedded_tasks():
    tasks = math_tasks("test")
    for i in range(20):
        assert read_marked_answer(_run(oracle_code(tasks[i]))) == tasks[i].gold


def test_oracle_code_for_loaded_tasks_prints_the_gold():
    task = Task("t", "q", gold="\\frac{1}{2}")
    assert read_marked_answer(_run(oracle_code(task))) == "\\frac{1}{2}"


def test_read_marked_answer_from_chat_and_inline_observations():
    assert read_marked_answer('\n```output\nORACLE_ANSWER="3/7"\n```\n') == "3/7"
    chat = '<|im_end|>\n<|im_start|>tool\nORACLE_ANSWER="-12"<|im_end|>\n<|im_start|>assistant\n'
    assert read_marked_answer(chat) == "-12"
    assert read_marked_answer("Error: NameError") == ""


def test_no_tool_policy_guesses_the_last_number_without_calling_tools():
    policy = MathNoToolPolicy()
    policy.reset(Task("t", "Compute 1,234 × 5,678.", gold="7006652"))
    assert policy.act("", {}) == "The answer is \\boxed{5678}."
    policy.reset(Task("t", "No numbers here?", gold="1"))
    assert policy.act("", {}) == "The answer is \\boxed{0}."


def test_code_policy_refuses_tasks_without_solution_code():
    from vt_envs.domains.math.oracle import MathCodePolicy

    with pytest.raises(ValueError, match="MathOracle"):
        MathCodePolicy().reset(Task(id="gsm8k/0", prompt="2 + 2?", gold="4"))


def test_last_output_line_skips_fences_and_blank_lines():
    from vt_envs.domains.math.oracle import last_output_line

    assert last_output_line("\n```output\n12\n345\n```\n") == "345"
    assert last_output_line("") == ""
