"""VT-Multi-v0's oracle and baselines.

:class:`MultiOracle` finds the facts with the fact tool, then computes with Python on
what it returned (it scores 1); :class:`MultiNoToolPolicy` answers at once;
:class:`MultiFactsOnlyPolicy` looks the facts up but computes without Python (an
approximate step). Both baselines score low.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from vt_envs.core.policy import OraclePolicy, Policy
from vt_envs.core.task import Task
from vt_envs.domains.visual.bbox import union_box
from vt_envs.domains.visual.oracle import ZOOM_MARGIN

__all__ = ["MultiFactsOnlyPolicy", "MultiNoToolPolicy", "MultiOracle", "facts_only_shortcut"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _fact_call(task: Task, step: int) -> str | None:
    """The oracle's (and the facts-only baseline's) fact-tool call number ``step``,
    or ``None`` once the facts are in: one query, two searches, or one zoom per tag."""
    oracle, family = task.assets["oracle"], task.metadata["family"]
    if family.startswith("sql"):
        return f"<sql>{oracle['query']}</sql>" if step == 0 else None
    if family == "search_days":
        return f"<search>{oracle['queries'][step]}</search>" if step < 2 else None
    if step >= len(oracle["targets"]):
        return None
    width, height = task.assets["image_size"]
    box = union_box([oracle["targets"][step]], width, height, ZOOM_MARGIN)
    call = {"name": "zoom", "arguments": {"bbox": list(box), "image": 0}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def _sql_values(content: str) -> list[str]:
    """The value lines of the SQL tool's result (header first, ``(n rows)`` last)."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    return [line for line in lines[1:] if not line.startswith("(")]


class MultiOracle(OraclePolicy):
    """Finds the facts with SQL or search, computes with Python, answers what it printed.

    SQL families: the oracle's query, then Python over the values the result
    shows (read from the observation). ``search_days``: one search per
    sentence; the years come from the task (privileged) only once both
    sentences' articles were retrieved (else it answers ``""``), then Python
    does the calendar arithmetic.
    """

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.seen: list[str] = []
        self.computed = False

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        task, family = self.task, self.task.metadata["family"]
        message = str((info.get("message") or {}).get("content", ""))
        if self.turn > 0:
            self.seen.append(message)
        call = _fact_call(task, self.turn)
        if call is not None:
            return call
        if not self.computed:  # the facts are in: compute with them once
            self.computed = True
            return f"<python>\n{self._code(family, task.assets['oracle'])}\n</python>"
        lines = [line for line in message.splitlines() if line.strip()]
        return f"<answer>{lines[-1].strip() if lines else ''}</answer>"

    def _code(self, family: str, oracle: Mapping[str, Any]) -> str:
        if family in ("sql_lcm", "sql_product"):  # the values the query's result showed
            values = ", ".join(_sql_values(self.seen[0]))
            return oracle["code"].replace("VALUES", f"[{values}]")
        if family == "crop_product":  # the numbers are read by looking: only if both zooms worked
            zoomed = sum("Image" in seen and "pixels" in seen for seen in self.seen) == 2
            a, b = oracle["numbers"] if zoomed else (0, 0)
            return oracle["code"].replace("A", str(a)).replace("B", str(b))
        found = all(title in "".join(self.seen) for title in oracle["gold_titles"])
        years = oracle["years"] if found else [0, 0]
        return oracle["code"].replace("YEARS", repr(list(years)))


class MultiNoToolPolicy(Policy):
    """The no-tool baseline: answers at once with the last number of the question."""

    def reset(self, task: Task) -> None:
        numbers = _NUMBER.findall(task.prompt)
        self.guess = numbers[-1] if numbers else "0"

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<answer>{self.guess}</answer>"


class MultiFactsOnlyPolicy(OraclePolicy):
    """The one-tool baseline: the oracle's fact lookup, then an answer without Python.

    It computes the way a model (or SQL) without an interpreter might: the
    largest price for an LCM, a floating-point product, 365 days a year, a
    product of factors rounded to tens.
    """

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.seen: list[str] = []

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        family = self.task.metadata["family"]
        if self.turn > 0:
            self.seen.append(str((info.get("message") or {}).get("content", "")))
        call = _fact_call(self.task, self.turn)
        if call is not None:
            return call
        if family == "crop_product":  # rounds each factor to 10s, as a quick mental product
            a, b = self.task.assets["oracle"]["numbers"]
            return f"<answer>{round(a, -1) * round(b, -1)}</answer>"
        values = [float(v) for v in _sql_values(self.seen[0]) if _NUMBER.fullmatch(v)]
        if family == "sql_lcm":  # the largest price: the LCM's lower bound
            return f"<answer>{max((round(v * 100) for v in values), default=0)}</answer>"
        if family == "sql_product":  # a floating-point product, as SQL's own would be
            return f"<answer>{int(math.prod(v * 100 for v in values))}</answer>"
        years = self.task.assets["oracle"]["years"]
        return f"<answer>{365 * abs(years[0] - years[1])}</answer>"


def facts_only_shortcut(env: Any = None) -> MultiFactsOnlyPolicy:
    """Shortcut factory (the registration's): :class:`MultiFactsOnlyPolicy`."""
    return MultiFactsOnlyPolicy()
