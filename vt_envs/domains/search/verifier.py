"""Answer matching for retrieval QA: exact match after SQuAD normalization, F1, substring EM.

:func:`normalize_answer` is SQuAD's: lowercase, drop punctuation, drop the
articles *a*, *an*, *the*, collapse whitespace. A task's gold is a string or
a list of accepted answers; each metric takes the best over them.

The verifier only ever sees the agent's own final answer (the parser takes
it from the action; the prompt's example and tool output are never parsed),
so a passage that happens to hold ``<answer>…</answer>`` earns nothing.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

from vt_envs.core.task import Task
from vt_envs.core.verifier import Score, Verifier
from vt_envs.errors import InvalidConfigError

__all__ = [
    "METRICS",
    "AnswerMatch",
    "exact_match",
    "golds_of",
    "normalize_answer",
    "substring_match",
    "token_f1",
]

METRICS = ("em", "f1", "substring_em")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation + "‘’“”–—…")


def normalize_answer(text: str) -> str:
    """SQuAD normalization (plus Unicode NFKC and curly quotes/dashes treated as punctuation)."""
    text = unicodedata.normalize("NFKC", str(text)).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def golds_of(gold: Any) -> list[str]:
    """A task's accepted answers as strings (a string, a number, or a list of them)."""
    if isinstance(gold, (list, tuple)):
        return [str(g) for g in gold]
    if hasattr(gold, "tolist"):  # numpy arrays from Parquet
        return [str(g) for g in gold.tolist()]
    return [str(gold)]


def exact_match(answer: str, golds: Sequence[str]) -> float:
    given = normalize_answer(answer)
    return float(any(given == normalize_answer(g) for g in golds))


def substring_match(answer: str, golds: Sequence[str]) -> float:
    """1.0 when a normalized gold occurs in the normalized answer on word boundaries."""
    given = f" {normalize_answer(answer)} "
    return float(any(normalize_answer(g) and f" {normalize_answer(g)} " in given for g in golds))


def token_f1(answer: str, golds: Sequence[str]) -> float:
    """The best SQuAD token F1 of ``answer`` against each gold."""
    given = normalize_answer(answer).split()
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold).split()
        common = sum((Counter(given) & Counter(expected)).values())
        if common:
            precision, recall = common / len(given), common / len(expected)
            best = max(best, 2 * precision * recall / (precision + recall))
        elif not given and not expected:
            best = 1.0
    return best


class AnswerMatch(Verifier):
    """Scores an answer by ``metric`` (``"em"`` default, ``"f1"``, ``"substring_em"``);
    every metric is reported in the score's parts."""

    cheap = True  # string normalization and token overlap

    def __init__(self, metric: str = "em"):
        if metric not in METRICS:
            raise InvalidConfigError(f"metric must be one of {METRICS}, got {metric!r}")
        self.metric = metric

    def score(self, task: Task, answer: str) -> Score:
        golds = golds_of(task.gold)
        parts = {
            "em": exact_match(answer, golds),
            "f1": token_f1(answer, golds),
            "substring_em": substring_match(answer, golds),
        }
        value = parts[self.metric]
        detail = f"{self.metric}={value:.3g}" + ("" if value else f"; expected one of {golds[:3]}")
        return Score(value, parts, detail)
