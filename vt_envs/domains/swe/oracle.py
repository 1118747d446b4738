"""Scripted policies of VT-SWE-v0: the reverting oracle and a do-nothing baseline.

:class:`SWEOracle` knows the task's mutation (privileged assets) and fixes
it the way an agent must: it views the mutated file with the editor,
reverts the mutation with ``str_replace`` (the lines that differ from the
original file, widened until they occur once in the broken one), runs the visible tests with bash,
and submits. A reward of 1.0 proves that the working copy, the editor, the
sandboxed shell and the hidden-test evaluation fit together.

:class:`DoNothingPolicy` submits at once: the unfixed bug scores 0.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vt_envs.core.policy import OraclePolicy, Policy
from vt_envs.core.task import Task

__all__ = ["DoNothingPolicy", "SWEOracle", "revert_edit"]


def revert_edit(broken: str, original: str, *, context: int = 0) -> tuple[str, str]:
    """``(old_str, new_str)`` that turn ``broken`` back into ``original`` in one
    ``str_replace``: the lines that differ, widened by context until they occur once."""
    old_lines, new_lines = broken.split("\n"), original.split("\n")
    ops = [op for op in difflib.SequenceMatcher(a=old_lines, b=new_lines).get_opcodes()
           if op[0] != "equal"]  # fmt: skip
    if not ops:
        raise ValueError("the files do not differ")
    a0, a1, b0, b1 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    for extra in range(context, len(old_lines) + 1):
        lo, hi = max(0, a0 - extra), min(len(old_lines), a1 + extra)
        old = "\n".join(old_lines[lo:hi])
        if old and broken.count(old) == 1:
            new = "\n".join([*old_lines[lo:a0], *new_lines[b0:b1], *old_lines[a1:hi]])
            return old, new
    raise ValueError("no window of the broken file is unique")


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def plan_edits(repo: Path, source: Path, files: list[str]) -> list[str]:
    """The editor / bash calls that turn ``repo``'s ``files`` into ``source``'s: one
    ``str_replace`` per differing region (each computed on the file as the earlier ones
    left it), ``create`` for a new file, ``rm`` for a removed one."""
    calls = []
    for rel in files:
        before, after = repo / rel, source / rel
        if not before.exists():
            calls.append(_call("editor", command="create", path=rel, file_text=after.read_text()))
            continue
        if not after.exists():
            calls.append(_call("bash", command=f"rm -f -- '{rel}'"))
            continue
        text, goal = before.read_text(), after.read_text()
        while text != goal:
            old, new = revert_edit(text, goal)
            calls.append(_call("editor", command="str_replace", path=rel, old_str=old,
                               new_str=new))  # fmt: skip
            text = text.replace(old, new, 1)
    return calls


class SWEOracle(OraclePolicy):
    """Views the first changed file, makes the fix (:func:`plan_edits`), runs the visible
    tests, submits. The files are ``assets["changed_files"]`` (SWE-bench) or the mutation's."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        assets = task.assets
        files = list(assets.get("changed_files") or [assets["mutation"]["path"]])
        self.first = files[0]
        self.plan = plan_edits(Path(assets["repo"]), Path(assets["source"]), files)

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        if self.turn == 0:
            return _call("editor", command="view", path=self.first)
        if self.turn <= len(self.plan):
            return self.plan[self.turn - 1]
        if self.turn == len(self.plan) + 1:
            # Only the exit status: pytest's summary carries timings, which differ per run.
            return _call("bash", command="python -m pytest -q -x > /tmp/pytest.txt 2>&1; echo $?")
        return "<submit>reverted the faulty change</submit>"


class DoNothingPolicy(Policy):
    """Submits without changing anything."""

    def reset(self, task: Task) -> None:
        pass

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return "<submit>no change needed</submit>"
