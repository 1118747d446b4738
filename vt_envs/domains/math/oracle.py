"""Scripted policies for VT-Math-v0: the interpreter oracle, a plain-code demonstrator
and a no-tool baseline.

:class:`MathOracle` proves the env solvable end to end: it sends Python that
computes the answer, reads the printed result back *from the observation*
(not from the task), and answers it. On embedded tasks the code is the
task's own ``assets["solution_code"]``; on loaded datasets (which carry no
code) it prints the gold, which still exercises the tool round trip.

:class:`MathCodePolicy` writes what an agent would: the solution code as it
is (``print(413 * 307)``), then the last line the interpreter printed as the
answer. Its trajectories are SFT demonstrations (the quickstart's).

:class:`MathNoToolPolicy` answers at once, without the tool, with a crude
guess (the last number in the question): the floor a tool-using policy
must beat. :class:`MathShortcutPolicy` tries the other closed-book guesses a
benchmark author worries about (:data:`SHORTCUTS`: the largest number, the
product or sum of the numbers, 0, 1); on the embedded test split each stays
within a few points of zero (``tests/domains/math/test_math_shortcuts.py``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from vt_envs.core.policy import OraclePolicy, Policy
from vt_envs.core.task import Task

__all__ = [
    "ORACLE_MARKER",
    "SHORTCUTS",
    "MathCodePolicy",
    "MathNoToolPolicy",
    "MathOracle",
    "MathShortcutPolicy",
    "largest_shortcut",
    "product_shortcut",
    "sum_shortcut",
]

ORACLE_MARKER = "ORACLE_ANSWER="
_MARKED = re.compile(re.escape(ORACLE_MARKER) + r"(\".*\")")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def oracle_code(task: Task) -> str:
    """Python that prints ``ORACLE_ANSWER="<answer>"`` (JSON-quoted) for ``task``."""
    solution = task.assets.get("solution_code") if task.assets else None
    if solution is None:
        return f"import json\nprint({ORACLE_MARKER!r} + json.dumps({str(task.gold)!r}))"
    # Run the solution with stdout captured, so only its printed answer is marked.
    return (
        "import contextlib, io, json\n"
        "_out = io.StringIO()\n"
        "with contextlib.redirect_stdout(_out):\n"
        f"    exec({solution!r}, {{}})\n"
        f"print({ORACLE_MARKER!r} + json.dumps(_out.getvalue().strip()))"
    )


class MathOracle(OraclePolicy):
    """Computes the answer in the env's Python interpreter, then answers what it printed.

    Turn 0 sends ``<python>CODE</python>``; turn 1 answers
    ``<answer>VALUE</answer>`` with the value read from the observation
    (``""`` if the output is missing, which then scores 0).
    """

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        if self.turn == 0:
            return f"<python>\n{oracle_code(self.task)}\n</python>"
        return f"<answer>{read_marked_answer(observation)}</answer>"


class MathCodePolicy(OraclePolicy):
    """Runs the task's solution code unwrapped, then answers the last line it printed.

    Turn 0 sends ``<python>\nCODE\n</python>`` with the embedded task's own
    ``assets["solution_code"]`` (``print(413 * 307)`` for a product); turn 1
    answers ``<answer>LINE</answer>``, ``LINE`` the last non-empty line of the
    interpreter's output as the observation shows it (``""`` if there is
    none, which then scores 0). Needs embedded tasks: loaded datasets carry
    no code.
    """

    def reset(self, task: Task) -> None:
        if not task.assets or "solution_code" not in task.assets:
            raise ValueError(
                f"MathCodePolicy needs a task with assets['solution_code'] (the embedded "
                f"generator's); task {task.id!r} has none. Use MathOracle for loaded datasets."
            )
        super().reset(task)

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        if self.turn == 0:
            return f"<python>\n{self.task.assets['solution_code']}\n</python>"
        message = info.get("message") or {}
        output = str(message.get("content", ""))
        return f"<answer>{last_output_line(output)}</answer>"


def last_output_line(output: str) -> str:
    """The last non-empty line of an interpreter output, outside any ```` ``` ```` fence."""
    lines = [line.strip() for line in output.splitlines()]
    lines = [line for line in lines if line and not line.startswith("```")]
    return lines[-1] if lines else ""


def read_marked_answer(observation: str) -> str:
    """The value the oracle's code printed, read from an observation in any format."""
    matches = _MARKED.findall(observation)
    if not matches:
        return ""
    try:
        return str(json.loads(matches[-1]))
    except json.JSONDecodeError:
        return ""


class MathNoToolPolicy(Policy):
    """The no-tool baseline: answers ``\\boxed{N}`` at once, N the last number in the question."""

    def reset(self, task: Task) -> None:
        numbers = _NUMBER.findall(task.prompt)
        self.guess = numbers[-1].replace(",", "") if numbers else "0"

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"The answer is \\boxed{{{self.guess}}}."


def _numbers(prompt: str) -> list[int]:
    """The integers of a prompt (thousands separators removed; decimals dropped)."""
    return [int(n.replace(",", "")) for n in _NUMBER.findall(prompt) if "." not in n]


SHORTCUTS: dict[str, Callable[[str], int]] = {
    "last": lambda p: (_numbers(p) or [0])[-1],
    "largest": lambda p: max(_numbers(p), default=0),
    "product": lambda p: math.prod(n for n in _numbers(p) if abs(n) < 10**12),
    "sum": lambda p: sum(_numbers(p)),
    "zero": lambda p: 0,
    "one": lambda p: 1,
}
"""Closed-book guesses from the prompt's surface alone, by name."""


class MathShortcutPolicy(Policy):
    """A closed-book shortcut: answers at once with the ``strategy`` guess of
    :data:`SHORTCUTS` on the prompt, never calling the tool."""

    def __init__(self, strategy: str = "largest"):
        if strategy not in SHORTCUTS:
            raise ValueError(f"strategy must be one of {sorted(SHORTCUTS)}, got {strategy!r}")
        self.strategy = strategy

    def reset(self, task: Task) -> None:
        self.guess = SHORTCUTS[self.strategy](task.prompt)

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<answer>{self.guess}</answer>"


# Shortcut factories for the env registration (``factory(env) -> Policy``).
def product_shortcut(env: Any = None) -> MathShortcutPolicy:
    """The product of the prompt's integers."""
    return MathShortcutPolicy("product")


def largest_shortcut(env: Any = None) -> MathShortcutPolicy:
    """The prompt's largest integer."""
    return MathShortcutPolicy("largest")


def sum_shortcut(env: Any = None) -> MathShortcutPolicy:
    """The sum of the prompt's integers."""
    return MathShortcutPolicy("sum")
