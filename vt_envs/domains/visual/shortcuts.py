"""Options-only policies of VT-Visual-v0: the adversaries a fair multiple choice holds at chance.

Each answers at once with the option that one statistic of the options'
texts picks (:data:`STATISTICS`), never looking at the image: a fixed
letter (``letter-A`` is the no-tool baseline), the k-th smallest
(``rank-1``: the second-smallest; numbers compare as numbers, text
alphabetically), the ``medoid`` (closest to the others, characters
compared position by position), the ``outlier``, the best match of the
per-position majority (``consensus``), the most widely shared characters
(``common-chars``), the ``longest`` or ``shortest``. Ties go to the earliest
letter (the letters are a uniform shuffle).

:func:`fit_shortcut` scores every statistic on some tasks from their
prompts alone and keeps the best for each task kind; :class:`ShortcutPolicy`
plays that table. Fitted on train tasks and played on held-out ones, it is
the strongest options-only baseline here; ``tests/domains/visual/test_visual_shortcuts.py``
holds it (and every single statistic) at chance, and
``scripts/visual_baselines.py`` reports it next to the oracle and no-tool.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vt_envs.core.policy import Policy
from vt_envs.core.task import Task
from vt_envs.errors import InvalidConfigError

__all__ = [
    "STATISTICS",
    "ShortcutPolicy",
    "fit_shortcut",
    "options_of",
    "options_only_shortcut",
    "pick",
]

_OPTION = re.compile(r"^\(([A-H])\) (.*)$", re.MULTILINE)


def options_of(prompt: str) -> list[str]:
    """The options a prompt lists as ``(A) text`` lines, in letter order."""
    found = dict(_OPTION.findall(prompt))
    return [found[letter] for letter in sorted(found)]


def _distance(a: str, b: str) -> int:
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def _key(options: Sequence[str]) -> Callable[[str], Any]:
    try:
        [float(o) for o in options]
    except ValueError:
        return str
    return float


def _letter(k: int) -> Callable[[Sequence[str]], int]:
    return lambda options: min(k, len(options) - 1)


def _ranked(k: int) -> Callable[[Sequence[str]], int]:
    def rank(options: Sequence[str]) -> int:
        order = sorted(range(len(options)), key=lambda i: _key(options)(options[i]))
        return order[min(k, len(options) - 1)]

    return rank


def _best(score: Callable[[Sequence[str], int], float]) -> Callable[[Sequence[str]], int]:
    """The index of the highest ``score(options, i)`` (the earliest on ties)."""
    return lambda options: max(range(len(options)), key=lambda i: (score(options, i), -i))


def _consensus(options: Sequence[str], i: int) -> float:
    majority = [Counter(column).most_common(1)[0][0] for column in zip(*options)]
    return sum(c == m for c, m in zip(options[i], majority))


def _common_chars(options: Sequence[str], i: int) -> float:
    return sum(sum(c in other for other in options) for c in set(options[i]))


#: Statistic name -> the index of the option it picks.
STATISTICS: dict[str, Callable[[Sequence[str]], int]] = {
    **{f"letter-{c}": _letter(k) for k, c in enumerate("ABCD")},
    **{f"rank-{k}": _ranked(k) for k in range(4)},
    "medoid": _best(lambda o, i: -sum(_distance(o[i], x) for x in o)),
    "outlier": _best(lambda o, i: sum(_distance(o[i], x) for x in o)),
    "consensus": _best(_consensus),
    "common-chars": _best(_common_chars),
    "longest": _best(lambda o, i: len(o[i])),
    "shortest": _best(lambda o, i: -len(o[i])),
}


def pick(statistic: str, prompt: str) -> str:
    """The letter ``statistic`` picks from ``prompt``'s options (``"A"`` if it lists none)."""
    if statistic not in STATISTICS:
        raise InvalidConfigError(f"statistic must be one of {list(STATISTICS)}, got {statistic!r}")
    options = options_of(prompt)
    return "ABCDEFGH"[STATISTICS[statistic](options)] if options else "A"


def fit_shortcut(
    tasks: Iterable[Task], score: Callable[[Task, str], Any]
) -> dict[str, tuple[str, float]]:
    """For each task kind, the statistic that scores best on ``tasks`` from their
    prompts alone, and its mean score: ``{kind: (statistic, mean)}``.

    ``score(task, letter)`` grades an answer (an env's verifier: ``.value`` is read
    when present)."""
    totals: dict[str, Counter[str]] = {}
    counts: Counter[str] = Counter()
    for task in tasks:
        kind = str(task.metadata.get("kind", "all"))
        counts[kind] += 1
        row = totals.setdefault(kind, Counter())
        for name in STATISTICS:
            result = score(task, pick(name, task.prompt))
            row[name] += float(getattr(result, "value", result))
    return {
        kind: max(((n, v / counts[kind]) for n, v in row.items()), key=lambda nv: nv[1])
        for kind, row in totals.items()
    }


class ShortcutPolicy(Policy):
    """Answers at once with the letter its statistic for the task's kind picks from the
    prompt's options (``table``: ``{kind: statistic}``, or one statistic for every kind;
    a kind not in the table: ``letter-A``). It reads the task's kind, never its gold."""

    def __init__(self, table: str | Mapping[str, str] = "letter-A"):
        self.table = table
        names = [table] if isinstance(table, str) else list(table.values())
        for name in names:
            pick(name, "")  # refuses an unknown statistic now, not mid-episode

    def reset(self, task: Task) -> None:
        kind = str(task.metadata.get("kind", ""))
        table = self.table
        self.statistic = table if isinstance(table, str) else table.get(kind, "letter-A")

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<answer>{pick(self.statistic, observation)}</answer>"


@functools.lru_cache(maxsize=2)
def _fitted_table(tasks: int) -> tuple[tuple[str, str], ...]:
    from vt_envs.domains.visual.tasks import visual_tasks
    from vt_envs.domains.visual.verifier import ChoiceMatch

    fitted = fit_shortcut(visual_tasks("train", size=tasks), ChoiceMatch())
    return tuple((kind, statistic) for kind, (statistic, _) in sorted(fitted.items()))


def options_only_shortcut(env: Any = None, fit: int = 4000) -> ShortcutPolicy:
    """The options-only shortcut: for each kind, the option statistic that scores best
    on ``fit`` train tasks (fitted once per process), played without the image."""
    return ShortcutPolicy(dict(_fitted_table(fit)))
