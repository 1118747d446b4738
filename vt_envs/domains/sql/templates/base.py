"""What every question template is built from: :class:`Template` and the
seeded draws its ``sample`` function makes.

Parameter draws use only ``Random.random()`` (:func:`pick`), the one RNG output
Python keeps stable across versions, so a template's questions are the same
on every machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from random import Random
from typing import Any

__all__ = ["DIFFICULTIES", "Template", "draw_month", "draw_window", "pick", "sql_str"]

DIFFICULTIES = ("easy", "medium", "hard")
_MONTHS = (  # noqa: SIM905
    "January February March April May June July August September October November December"
).split()


def sql_str(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def pick(rng: Random, items: Sequence) -> Any:
    # random() is the one RNG output Python keeps stable across versions.
    return items[int(rng.random() * len(items))]


@dataclass(frozen=True)
class Template:
    """One kind of question.

    Attributes:
        id: ``"<db>/<name>"``, stored in task metadata.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        skills: what the gold SQL exercises (``"join"``, ``"window"``...).
        question: ``str.format`` text over the parameters.
        sql: ``str.format`` gold SQL over the parameters (string values are
            passed already quoted by :func:`sql_str` under ``<name>_sql``).
        sample: ``(pools, rng) -> params``.
        held_out: drawn only for the test split (a kind of question train never shows).
    """

    id: str
    difficulty: str
    skills: tuple[str, ...]
    question: str
    sql: str
    sample: Callable[[Mapping[str, list], Random], dict[str, Any]]
    held_out: bool = False

    def render(self, params: Mapping[str, Any]) -> tuple[str, str]:
        """The (question, gold SQL) for ``params``."""
        quoted = {f"{k}_sql": sql_str(v) for k, v in params.items() if isinstance(v, str)}
        values = {**params, **quoted}
        return self.question.format(**values), " ".join(self.sql.format(**values).split())


def draw_window(rng: Random, first: date, days: int) -> dict[str, Any]:
    """A date window: ``start`` (ISO) drawn over ``days`` days from ``first``, ``end``
    one to eight weeks later."""
    start = first + timedelta(days=int(rng.random() * days))
    end = start + timedelta(days=pick(rng, (6, 13, 20, 27, 41, 55)))
    return {"start": start.isoformat(), "end": end.isoformat()}


def draw_month(rng: Random) -> dict[str, Any]:
    month = 1 + int(rng.random() * 12)
    return {"month": month, "month_name": _MONTHS[month - 1]}
