"""Math answer equivalence: a fast exact path for numbers, math-verify for the rest.

:class:`MathVerifier` scores the model's *own* final answer (the text the
parser took from ``<answer>…</answer>`` or ``\\boxed{…}``) against the gold.
Tool output never reaches it, so an agent cannot earn reward by making the
interpreter print the answer without stating it.

Two paths:

- **Fast exact path** (in-process, microseconds): when both sides are plain
  numbers — integers, decimals, ``a/b``, ``\\frac{a}{b}``, thousands
  separators (``1,234``, ``1\\,234``, ``1{,}234``), a leading ``$`` — they
  are compared as exact rationals. Equal is final; unequal is final when
  neither side is a decimal (a decimal may be a rounding of the gold, which
  math-verify judges at ``float_rounding`` places) or when they differ by
  more than rounding could explain.
- **math-verify** (sets, intervals, percentages, units, ``\\pi``, algebraic
  forms, equations): run in a persistent worker process
  (:mod:`vt_envs.domains.math.verify_worker`) with our own deadline, because
  math-verify's built-in timeout uses ``signal.alarm`` and fails outside the
  main thread. On a timeout the worker is killed (restarted on the next
  call) and the answer scores 0. One worker serves every verifier of the
  process, behind a lock, so it is safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from fractions import Fraction

from vt_envs.core.task import Task
from vt_envs.core.tool import check_timeout
from vt_envs.core.verifier import NO_TOOLS, EpisodeTools, Score, Verifier
from vt_envs.errors import InvalidConfigError

__all__ = [
    "MathVerifier",
    "extract_final_answer",
    "last_boxed",
    "parse_plain_number",
    "shutdown_worker",
]

_WORKER_START_TIMEOUT_S = 60.0  # importing sympy on a busy CI core can be slow

_NUMBER = re.compile(
    r"""^(?P<sign>[-+]?)\s*
    (?:\\?\$)?\s*                                   # a currency sign: $12, \$12
    (?:
        (?P<int>\d{1,3}(?:(?:,|\\,|\{,\}|\\!)\d{3})+|\d+)(?P<dec>\.\d+)?   # 1,234.5
      | (?P<lead>\.\d+)                                                   # .5
    )$""",
    re.VERBOSE,
)
_FRACTION = re.compile(r"^(?P<sign>[-+]?)\s*(?P<num>\d+)\s*/\s*(?P<den>\d+)$")
_LATEX_FRACTION = re.compile(
    r"^(?P<sign>[-+]?)\s*\\[dt]?frac\s*\{\s*(?P<num>[-+]?\d+)\s*\}\s*\{\s*(?P<den>\d+)\s*\}$"
)
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_BRACES = re.compile(r"\\(boxed|fbox)\{|[{}]")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or, if none closes, ``\\fbox{...}``)
    whose braces close.

    One pass over the braces with a stack (linear: an answer full of unclosed
    ``\\boxed{`` costs no more than any other), pairing each brace with its
    closing one as counting depth forward from it would.
    """
    stack: list[tuple[str | None, int]] = []  # (command or None, where its content starts)
    last: dict[str, tuple[int, int]] = {}
    for match in _BRACES.finditer(text):
        token = match.group(0)
        if token == "}":
            if stack:
                command, begin = stack.pop()
                if command is not None and (command not in last or begin > last[command][0]):
                    last[command] = (begin, match.start())
        else:
            stack.append((match.group(1), match.end()))  # group 1: None for a plain brace
    for command in ("boxed", "fbox"):
        if command in last:
            begin, end = last[command]
            return text[begin:end]
    return None


def extract_final_answer(text: str) -> str:
    """The final answer inside the model's answer text.

    The answer the parser hands over may still carry its own decoration:
    ``\\boxed{…}`` inside the answer tag (the last one wins), a GSM8K-style
    ``#### N``, ``$…$`` delimiters, a trailing full stop. Returns ``""``
    for nothing usable.
    """
    text = text.strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed.strip()
    elif "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    for left, right in _WRAPPERS:
        if text.startswith(left) and text.endswith(right) and len(text) >= len(left + right):
            text = text[len(left) : len(text) - len(right)].strip()
    return text.rstrip(".").strip()


def parse_plain_number(text: str) -> tuple[Fraction, bool] | None:
    """``(value, is_decimal)`` when ``text`` is a plain number, else ``None``.

    Plain numbers: ``-12``, ``1,234,567``, ``1\\,234``, ``$12``, ``3.50``,
    ``.5``, ``3/7``, ``\\frac{3}{7}``. ``is_decimal`` says the text had a
    decimal point (so it may be a rounded value). Anything else (``50%``,
    ``12 cm``, ``\\pi``, ``1e3``) is left to math-verify.
    """
    text = text.strip()
    match = _NUMBER.match(text)
    if match:
        sign = -1 if match["sign"] == "-" else 1
        if match["lead"]:
            return sign * Fraction(match["lead"]), True
        digits = re.sub(r"\D", "", match["int"])
        value = Fraction(digits) + (Fraction(match["dec"]) if match["dec"] else 0)
        return sign * value, match["dec"] is not None
    for pattern in (_FRACTION, _LATEX_FRACTION):
        match = pattern.match(text)
        if match and int(match["den"]) != 0:
            sign = -1 if match["sign"] == "-" else 1
            return sign * Fraction(int(match["num"]), int(match["den"])), False
    return None


def _fast_verdict(gold: str, answer: str, float_rounding: int) -> bool | None:
    """Equal / unequal when both are plain numbers and the verdict is certain, else ``None``."""
    parsed_gold, parsed_answer = parse_plain_number(gold), parse_plain_number(answer)
    if parsed_gold is None or parsed_answer is None:
        return None
    (g, g_dec), (a, a_dec) = parsed_gold, parsed_answer
    if g == a:
        return True
    if not (g_dec or a_dec):
        return False
    # A decimal may be the other side rounded; only math-verify's rounding rule
    # decides close calls, but a gap far above the rounding unit is final.
    if abs(g - a) > Fraction(10) ** (2 - float_rounding) * max(1, abs(g)):
        return False
    return None


class _Worker:
    """One math-verify worker process, restarted after a timeout or crash."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid_owner = os.getpid()
        self._buffer = b""
        self.lock = threading.Lock()
        self.starts = 0

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "vt_envs.domains.math.verify_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        self._pid_owner, self._buffer = os.getpid(), b""
        self.starts += 1
        if self._read_line(time.monotonic() + _WORKER_START_TIMEOUT_S) is None:
            self.kill()
            raise RuntimeError("the math-verify worker did not start")

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:  # the worker died
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def request(self, payload: dict, timeout_s: float) -> dict | None:
        """Send one request; ``None`` on timeout or a dead worker (which is then killed)."""
        if self._proc is None or self._proc.poll() is not None or self._pid_owner != os.getpid():
            self._proc = None  # a forked child must not share its parent's worker
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(payload).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            self.kill()
            return None
        return json.loads(line)

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and self._pid_owner == os.getpid():
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


_WORKER = _Worker()


def shutdown_worker() -> None:
    """Stop the shared math-verify worker (it restarts on the next slow-path call)."""
    with _WORKER.lock:
        _WORKER.kill()


atexit.register(shutdown_worker)


class MathVerifier(Verifier):
    """Scores a model's final math answer against ``task.gold`` (1.0 equivalent, else 0.0).

    Args:
        timeout_s: the deadline of one math-verify comparison; past it the
            answer scores 0 (``detail="timeout"``) and the worker restarts.
        float_rounding: decimal places math-verify compares floats at.
        fast_path: compare plain numbers exactly in-process (skip the worker).

    ``Score.parts`` is ``{"correct": value}``; ``Score.detail`` names the path
    that decided (``"exact"``, ``"math-verify"``, ``"timeout"``, ``"no answer"``,
    ``"error"``).
    """

    def __init__(self, *, timeout_s: float = 5.0, float_rounding: int = 6, fast_path: bool = True):
        if not isinstance(float_rounding, int) or float_rounding < 0:
            raise InvalidConfigError(f"float_rounding must be an int >= 0, got {float_rounding!r}")
        self.timeout_s = check_timeout("timeout_s", timeout_s)
        self.float_rounding = float_rounding
        self.fast_path = fast_path

    def score(self, task: Task, answer: str) -> Score:
        verdict, detail = self.compare(str(task.gold), answer)
        value = float(verdict)
        return Score(value, {"correct": value}, detail)

    async def averify(self, task: Task, answer: str, tools: EpisodeTools = NO_TOOLS) -> Score:
        """The env's entry point: the exact path inline (string work, no thread hop);
        only an answer it cannot decide goes to math-verify, in a thread."""
        gold, given = extract_final_answer(str(task.gold)), extract_final_answer(answer)
        verdict = _fast_verdict(gold, given, self.float_rounding) if given else False
        if not given or (self.fast_path and verdict is not None):
            value = float(bool(verdict))
            return Score(value, {"correct": value}, "exact" if given else "no answer")
        return await asyncio.to_thread(self.score, task, answer)

    def equivalent(self, gold: str, answer: str) -> bool:
        """Whether ``answer`` is mathematically equivalent to ``gold``."""
        return self.compare(gold, answer)[0]

    def compare(self, gold: str, answer: str) -> tuple[bool, str]:
        """``(equal, which path decided)`` for ``answer`` against ``gold``."""
        gold, answer = extract_final_answer(gold), extract_final_answer(answer)
        if not answer:
            return False, "no answer"
        if self.fast_path:
            verdict = _fast_verdict(gold, answer, self.float_rounding)
            if verdict is not None:
                return verdict, "exact"
        payload = {"gold": gold, "answer": answer, "float_rounding": self.float_rounding}
        with _WORKER.lock:
            reply = _WORKER.request(payload, self.timeout_s)
        if reply is None:
            return False, "timeout"
        if "error" in reply:
            return False, "error"
        return bool(reply["equal"]), "math-verify"

    def __repr__(self) -> str:
        return (
            f"MathVerifier(timeout_s={self.timeout_s}, float_rounding={self.float_rounding}, "
            f"fast_path={self.fast_path})"
        )
