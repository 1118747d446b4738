"""Typed errors for developers using VT.

Every error a *developer* can cause (a wrong keyword, an unknown id, a bad
config, a missing sandbox) is a subclass of :class:`VTError` and its message
says what was expected, what was given, and the likely fix. Mistakes made by
the *policy* (malformed tool calls, tool errors, timeouts) are never raised:
they become observations and are counted in ``info``.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "AsyncContextError",
    "AsyncWrapperError",
    "DatasetFormatError",
    "EnvClosedError",
    "InvalidConfigError",
    "NoImageTokenError",
    "ResetNeededError",
    "SandboxUnavailableError",
    "SubEnvError",
    "TemplateError",
    "ToolServerRefusedError",
    "UnknownKwargError",
    "UnknownNameError",
    "UnknownTaskError",
    "UnknownToolError",
    "VTError",
    "console_main",
    "did_you_mean",
]


def did_you_mean(given: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""``."""
    close = difflib.get_close_matches(given, list(choices), n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in choices}
        if given.lower() in lowered:
            close = [lowered[given.lower()]]
    return f" Did you mean {close[0]!r}?" if close else ""


class VTError(Exception):
    """Base class of every error VT raises for developers."""


class UnknownNameError(VTError, KeyError):
    """Raised when a registry lookup (tool, algorithm, loader, ...) misses."""

    def __init__(self, kind: str, given: str, known: Iterable[str], hint: str = ""):
        known = sorted(known)
        self.kind, self.given, self.known = kind, given, known
        message = (
            f"Unknown {kind} {given!r}.{did_you_mean(given, known)} "
            f"Known {kind}s: {', '.join(known) or '(none registered)'}."
        )
        if hint:
            message += f" {hint}"
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnknownToolError(UnknownNameError):
    """Raised when a tool name is not registered (built in or via entry points)."""

    def __init__(self, given: str, known: Iterable[str]):
        super().__init__(
            "tool",
            given,
            known,
            hint="Third-party tools register under the entry-point group 'vt_envs.tools'.",
        )


class UnknownKwargError(VTError, TypeError):
    """Raised when an env builder or config receives a keyword it does not accept."""

    def __init__(self, owner: str, given: str | None = None, accepted: Iterable[str] = ()):
        if given is None:  # re-raised with an extended message (gymnasium.make does this)
            super().__init__(owner)
            return
        accepted = sorted(accepted)
        self.owner, self.given, self.accepted = owner, given, accepted
        super().__init__(
            f"{owner} got an unexpected keyword argument {given!r}."
            f"{did_you_mean(given, accepted)} Accepted keywords: {', '.join(accepted)}."
        )


class UnknownTaskError(VTError, KeyError):
    """Raised when ``options["task_id"]`` names a task that the task source lacks."""

    def __init__(self, given: str, source: str, examples: Iterable[str]):
        # The message (a "did you mean" over every id) is written only when read: a
        # tool server that refuses an unknown id must not pay for it per request.
        super().__init__(given, source)
        self.given, self.source, self._examples = given, source, examples

    def __str__(self) -> str:
        examples = list(self._examples)
        return (
            f"Task id {self.given!r} is not in task source {self.source!r}."
            f"{did_you_mean(self.given, examples)} "
            f"Example ids: {', '.join(examples[:5])}. Pass options={{'task': Task(...)}} "
            "to run a task that is not in the source."
        )


class InvalidConfigError(VTError, ValueError):
    """Raised when a configuration value is out of range or inconsistent."""


class NoImageTokenError(InvalidConfigError):
    """Raised when an env with images is built with a tokenizer that has no image
    token (a text-only model): the policy could not be shown the images."""


class ToolServerRefusedError(InvalidConfigError):
    """Raised when a tool server refuses to open a session for a reason the client's
    configuration causes (an env id, keyword, tool or task the server does not serve);
    the message is the server's reason."""


class TemplateError(VTError, ValueError):
    """Raised when a tokenizer's chat template cannot be used token-in/token-out
    (it does not preserve the prefix of a conversation, or has no template)."""


class AsyncContextError(VTError, RuntimeError):
    """Raised when a sync method (``step``, ``reset``, ``close``) is called from a
    coroutine on VT's own event loop; the message names the coroutine to await."""


class AsyncWrapperError(VTError, TypeError):
    """Raised when ``areset``/``astep`` meets a Gymnasium wrapper that changes
    ``reset``/``step`` but has no async twin registered."""


class EnvClosedError(VTError, RuntimeError):
    """Raised when an env is used after ``close()``."""


class ResetNeededError(VTError, RuntimeError):
    """Raised when ``step`` is called before ``reset`` or after the episode ended."""


class SubEnvError(VTError, RuntimeError):
    """Raised by a vector env when one sub-env's reset or step raised.

    Attributes:
        index: the sub-env that failed.
        phase: ``"reset"`` or ``"step"``.
        results: on a step, every sub-env's result (the failed one as an
            error truncation), so the others' work is not lost.
    """

    def __init__(self, index: int, phase: str, cause: BaseException, results=None):
        self.index, self.phase, self.results = index, phase, results
        super().__init__(
            f"sub-env {index} raised during {phase}: {type(cause).__name__}: {cause}. The "
            "other sub-envs' results are in .results; this sub-env resets before its next "
            "step. Use on_error='truncate' to get it as a truncation with info['error'] instead."
        )


class SandboxUnavailableError(VTError, RuntimeError):
    """Raised when no isolation layer works and the caller did not explicitly
    opt into unsandboxed execution; the message says what to install."""


class DatasetFormatError(VTError, ValueError):
    """Raised when a dataset file lacks the fields a loader was told to read."""


def console_main(prog: str, main: Callable[[list[str]], int | None]) -> Callable[[], None]:
    """A console-script entry point around ``main(argv)``: a user error (a
    :class:`VTError`: bad config key, unknown id, missing model, unreachable
    endpoint) prints one line, ``PROG: error: ...``, and exits 2; ``--debug`` (or
    ``VT_DEBUG=1``) lets the traceback through. ``main`` itself keeps raising, for
    callers that want the exception."""

    def run(argv: Sequence[str] | None = None) -> None:
        args = list(sys.argv[1:] if argv is None else argv)
        debug = "--debug" in args or os.environ.get("VT_DEBUG", "") not in ("", "0")
        args = [a for a in args if a != "--debug"]
        try:
            code = main(args)
        except VTError as error:
            if debug:
                raise
            message = " ".join(str(error).split())
            print(f"{prog}: error: {message} (--debug shows the traceback)", file=sys.stderr)
            sys.exit(2)
        sys.exit(int(code or 0))

    return run
