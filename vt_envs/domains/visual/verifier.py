"""VT-Visual-v0's verifier: :class:`ChoiceMatch`, an option letter or text against the gold."""

from __future__ import annotations

import re

from vt_envs.core.task import Task
from vt_envs.core.verifier import Score, Verifier
from vt_envs.domains.visual.tasks import LETTERS

__all__ = ["ChoiceMatch"]

_LETTER = re.compile(r"^\s*\(?([A-H])\)?(?:[\s.:)]|$)")


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


class ChoiceMatch(Verifier):
    """Scores a letter (``"B"``, ``"(B)"``, ``"B) blue"``) or an option's text against the gold
    letter; in the open form, the normalized answer against the gold text."""

    cheap = True  # a letter or a normalized string compared

    def score(self, task: Task, answer: str) -> Score:
        choices = list(task.assets.get("choices", ()))
        gold = str(task.gold)
        if choices:
            match = _LETTER.match(answer)
            given = match.group(1) if match else None
            if given is None:
                texts = {_normalize(c): LETTERS[i] for i, c in enumerate(choices)}
                given = texts.get(_normalize(answer))
            value = float(given == gold)
        else:
            value = float(_normalize(answer) == _normalize(gold))
        return Score(value, {"correct": value}, "" if value else f"expected {gold!r}")
