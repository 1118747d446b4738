"""Verifiers: pure, deterministic scoring of an answer against a task's gold.

A verifier is any callable ``(task, answer_text) -> Score``. It only ever sees
text the *model* wrote (the content of its final answer), never tool output,
so an agent cannot earn reward by making a tool echo the gold answer.

The env runs a plain verifier in a thread (so a slow one never stalls other
episodes); a verifier that does its work elsewhere (a sandboxed worker) may
instead define ``async def averify(task, answer) -> Score``, which the env
awaits, and ``async def aclose()``, which the env awaits when it closes. One
that sets ``uses_tool_sessions = True`` is awaited as ``averify(task,
answer, sessions=...)`` with the running episode's ``{tool name: (tool,
session)}``, still open, so it can grade where the episode's state already
is (VT-SQL-v0 runs the answer's SQL in the episode's own worker; it still
grades only the answer's text, never what a tool printed).
Either way the env gives it a deadline (``ToolEnv(verify_timeout_s=...)``):
a verification that overruns it scores 0. A verifier that sets ``inline =
True`` promises to be cheap and pure (a string comparison, linear in the
answer): the env calls it directly, without a thread hop or a deadline.
A verifier that sets ``reads_tools = True`` grades the state the episode's
tools changed (VT-SWE-v0's hidden tests run on the working copy its bash and
editor edited), so its tools must run in this process: such an env refuses
``tool_server=`` and a tool server refuses to serve it (:func:`reads_tools`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vt_envs.core.task import Task

__all__ = ["ExactMatch", "Score", "Verifier", "reads_tools"]


@dataclass(frozen=True)
class Score:
    """The verdict on one answer.

    Attributes:
        value: the outcome reward, usually in ``[0, 1]``.
        parts: named components (``{"correct": 1.0}``) for logging; the env
            merges them into ``info["reward_parts"]``.
        detail: a short human-readable explanation (for transcripts, not
            shown to the agent).
    """

    value: float
    parts: Mapping[str, float] = field(default_factory=dict)
    detail: str = ""


@runtime_checkable
class Verifier(Protocol):
    """Scores ``answer`` (the model's own final answer text) for ``task``."""

    def __call__(self, task: Task, answer: str) -> Score: ...


def reads_tools(verifier: Any) -> bool:
    """Whether ``verifier`` declares (``reads_tools = True``, default ``False``) that it
    grades the state its episode's tools changed, so they cannot run elsewhere."""
    return getattr(verifier, "reads_tools", False) is True


class ExactMatch:
    """1.0 when the stripped answer equals ``str(task.gold)``, else 0.0.

    Args:
        case_sensitive: compare case-sensitively (default ``True``).
    """

    inline = True  # a string comparison: the env calls it directly

    def __init__(self, *, case_sensitive: bool = True):
        self.case_sensitive = case_sensitive

    def __call__(self, task: Task, answer: str) -> Score:
        given, gold = answer.strip(), str(task.gold).strip()
        if not self.case_sensitive:
            given, gold = given.lower(), gold.lower()
        value = float(given == gold)
        return Score(value, {"correct": value}, "exact match" if value else f"expected {gold!r}")
