"""Verifiers: deterministic scoring of an answer against a task's gold.

One contract, :class:`Verifier`: the env awaits ``verifier.averify(task, answer,
tools)`` on the episode's final answer, where ``answer`` is text the *model* wrote
(the content of its final answer, never tool output: an agent cannot earn reward
by making a tool echo the gold) and ``tools`` the episode's tools with their
sessions, still open (``name -> (tool, session)``, read-only), so a verifier can
grade where the episode's state already is (VT-SQL-v0 runs the answer's SQL in the
episode's own worker). The env gives it a deadline (``ToolEnv(verify_timeout_s=...)``):
a verification that overruns it scores 0.

What a verifier needs is declared on its class, never probed:

- override :meth:`Verifier.score` (sync ``(task, answer) -> Score``): the default
  ``averify`` runs it in a thread, so a slow one never stalls other episodes;
  ``cheap = True`` promises it is cheap and pure (a string comparison, linear in
  the answer): then it runs on the loop, without a thread hop or a deadline;
- or override :meth:`Verifier.averify` for work done elsewhere (a sandboxed
  worker) or in the episode's tools;
- ``reads_tools = True``: it grades the state the episode's tools changed
  (VT-SWE-v0's hidden tests run on the working copy its bash and editor edited),
  so the tools must run in this process: such an env refuses ``tool_server=``
  and a tool server refuses to serve it;
- :meth:`Verifier.aclose` releases what it holds; the env awaits it on close.

A plain function ``(task, answer) -> Score`` is a verifier too
(:func:`as_verifier` makes it one: scored in a thread, under the deadline).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from vt_envs.core.task import Task
from vt_envs.errors import InvalidConfigError

__all__ = [
    "NO_TOOLS",
    "EpisodeTools",
    "ExactMatch",
    "FunctionVerifier",
    "Score",
    "Verifier",
    "as_verifier",
]

#: The episode's tools as a verifier sees them: tool name -> ``(tool, open session)``.
EpisodeTools = Mapping[str, tuple[Any, Any]]

#: What a verifier called outside an episode gets as ``tools``.
NO_TOOLS: EpisodeTools = MappingProxyType({})

# What verifiers declared before this contract: refused with the fix, not ignored.
_OLD_MODES = ("inline", "uses_tool_sessions")


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


class Verifier:
    """Scores ``answer`` (the model's own final answer text) for ``task``.

    Subclasses override :meth:`score` or :meth:`averify` (see the module docstring)
    and declare ``cheap`` and ``reads_tools``. Calling a verifier
    (``verifier(task, answer)``) scores one answer outside any episode (no tools).
    """

    #: Cheap and pure: :meth:`score` runs on the event loop, with no deadline.
    cheap: ClassVar[bool] = False
    #: Grades the state the episode's tools changed: the tools cannot run elsewhere.
    reads_tools: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        old = [name for name in _OLD_MODES if name in vars(cls)]
        if "__call__" in vars(cls) and not {"score", "averify"} & vars(cls).keys():
            old.append("__call__")
        if old:
            raise TypeError(
                f"{cls.__qualname__} defines {old}, which the env no longer reads: override "
                "score(task, answer) (set cheap = True for string work) or "
                "async averify(task, answer, tools) (tools: the episode's open sessions)"
            )

    def score(self, task: Task, answer: str) -> Score:
        """The verdict on ``answer`` (sync). Override this or :meth:`averify`."""
        raise NotImplementedError(f"{type(self).__name__} overrides neither score() nor averify()")

    async def averify(self, task: Task, answer: str, tools: EpisodeTools = NO_TOOLS) -> Score:
        """The env's entry point: :meth:`score`, on the loop when ``cheap``, else in a
        thread. ``tools``: the episode's ``name -> (tool, open session)``."""
        if self.cheap:
            return self.score(task, answer)
        return await asyncio.to_thread(self.score, task, answer)

    async def aclose(self) -> None:
        """Release what the verifier holds (workers); the env awaits it on close."""

    def __call__(self, task: Task, answer: str) -> Score:
        """Score ``answer`` outside an episode (no tools), waiting for the result."""
        if type(self).score is not Verifier.score:
            return self.score(task, answer)
        from vt_envs.core.loop import run_sync

        name = type(self).__name__
        return run_sync(self.averify(task, answer), method=name, async_method="averify")


class FunctionVerifier(Verifier):
    """A plain ``(task, answer) -> Score`` function as a :class:`Verifier` (scored in
    a thread, under the deadline)."""

    def __init__(self, fn: Callable[[Task, str], Score]):
        self.fn = fn

    def score(self, task: Task, answer: str) -> Score:
        return self.fn(task, answer)

    def __repr__(self) -> str:
        return f"FunctionVerifier({getattr(self.fn, '__qualname__', self.fn)!r})"


def as_verifier(verifier: Any) -> Verifier:
    """``verifier`` as a :class:`Verifier`: itself, or a plain function wrapped in
    :class:`FunctionVerifier`.

    Raises:
        InvalidConfigError: an object that is neither, or one written for the old
            probed modes (``inline``, ``uses_tool_sessions``, ``averify`` without
            subclassing :class:`Verifier`), which would silently be scored another way.
    """
    if isinstance(verifier, Verifier):
        return verifier
    old = [name for name in (*_OLD_MODES, "averify", "reads_tools") if hasattr(verifier, name)]
    if old or not callable(verifier):
        why = f"it defines {old}" if old else "it is not callable"
        raise InvalidConfigError(
            f"verifier must be a vt_envs.Verifier or a function (task, answer) -> Score; "
            f"{type(verifier).__name__} is neither ({why}). Subclass vt_envs.Verifier and "
            "override score(task, answer) (cheap = True for string work) or async "
            "averify(task, answer, tools)"
        )
    return FunctionVerifier(verifier)


class ExactMatch(Verifier):
    """1.0 when the stripped answer equals ``str(task.gold)``, else 0.0.

    Args:
        case_sensitive: compare case-sensitively (default ``True``).
    """

    cheap = True  # a string comparison

    def __init__(self, *, case_sensitive: bool = True):
        self.case_sensitive = case_sensitive

    def score(self, task: Task, answer: str) -> Score:
        given, gold = answer.strip(), str(task.gold).strip()
        if not self.case_sensitive:
            given, gold = given.lower(), gold.lower()
        value = float(given == gold)
        return Score(value, {"correct": value}, "exact match" if value else f"expected {gold!r}")
