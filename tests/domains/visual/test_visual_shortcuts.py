"""VT-Visual-v0's options give nothing away: no options-only policy beats chance.

The bound: chance (1/4 for four options, 1/2 for ``relation``) plus 4 points,
on 1,000 held-out tasks per kind. One statistic's score there has a standard
deviation of 1.4 points (p = 1/4) or 1.6 (p = 1/2), and the best of the 14
statistics of :data:`STATISTICS` lands about 2 deviations above chance by luck
alone, so 4 points is ~2.5-3 deviations: room for luck, none for a leak. The
generator this replaced gave the gold away at +69 (label: the medoid, 0.94)
and +75 points (count: the second-smallest, 1.00).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.domains.visual import visual_tasks
from vt_envs.domains.visual.shortcuts import (
    STATISTICS,
    ShortcutPolicy,
    fit_shortcut,
    options_of,
    pick,
)
from vt_envs.errors import InvalidConfigError

TASKS = 4000  # held-out tasks, the four kinds in rotation
CHANCE = {"label": 0.25, "color": 0.25, "count": 0.25, "relation": 0.5}
MARGIN = 0.04


@pytest.fixture(scope="module")
def held_out():
    env = gym.make("VT-Visual-v0", split="test", size=TASKS)
    yield env
    env.close()


def _scores(env) -> dict[str, dict[str, float]]:
    """Every statistic's mean reward by kind, graded by the env's own verifier."""
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    counts: Counter[str] = Counter()
    for task in env.unwrapped.tasks:
        kind = task.metadata["kind"]
        counts[kind] += 1
        for name in STATISTICS:
            totals[kind][name] += env.unwrapped.verifier(task, pick(name, task.prompt)).value
    return {k: {n: v / counts[k] for n, v in row.items()} for k, row in totals.items()}


def test_no_option_statistic_beats_chance_on_any_kind(held_out):
    scores = _scores(held_out)
    assert sorted(scores) == sorted(CHANCE)
    for kind, row in scores.items():
        best = max(row, key=row.get)
        assert row[best] <= CHANCE[kind] + MARGIN, (
            f"{kind}: picking the option by {best!r} scores {row[best]:.3f} without the "
            f"image (chance {CHANCE[kind]}); the options point at the gold: {row}"
        )


def test_the_shortcut_fitted_on_train_plays_at_chance_on_held_out_episodes(held_out):
    env = held_out.unwrapped
    fitted = fit_shortcut(visual_tasks("train", size=TASKS), env.verifier)
    for kind, (statistic, score) in fitted.items():
        assert score <= CHANCE[kind] + MARGIN, (kind, statistic, score)
    policy = ShortcutPolicy({kind: statistic for kind, (statistic, _) in fitted.items()})
    # Played through the env's actions: each episode's reward is what the fast path
    # above grades, so the bound holds for the policy as played.
    for task in itertools.islice(env.tasks, 8):
        result = vt_envs.run_episode(held_out, policy, options={"task_id": task.id})
        statistic = fitted[task.metadata["kind"]][0]
        assert result.turns == 1 and result.actions == [
            f"<answer>{pick(statistic, task.prompt)}</answer>"
        ]
        assert result.reward == env.verifier(task, pick(statistic, task.prompt)).value


def test_the_option_sets_are_symmetric_around_the_gold():
    ranks: dict[str, Counter[int]] = defaultdict(Counter)
    for task in visual_tasks("test", size=800):
        options = options_of(task.prompt)
        gold = options["ABCD".index(task.gold)]
        kind = task.metadata["kind"]
        if kind == "count":  # four consecutive numbers, the gold at any rank
            numbers = sorted(int(o) for o in options)
            assert numbers == list(range(numbers[0], numbers[0] + 4)) and numbers[0] >= 1
            ranks[kind][numbers.index(int(gold))] += 1
        elif kind == "label":  # every two codes differ in exactly two characters
            for a, b in itertools.combinations(options, 2):
                assert sum(x != y for x, y in zip(a, b)) == 2, options
        ranks["letter"][task.gold] += 1
    assert min(ranks["count"].values()) >= 0.18 * 200, ranks["count"]  # each rank ~ 1/4
    assert len(ranks["letter"]) == 4


def test_statistics_pick_what_they_say_and_unknown_ones_are_refused():
    prompt = "Q?\n(A) 5\n(B) 3\n(C) 4\n(D) 10\nAnswer with the option's letter."
    assert options_of(prompt) == ["5", "3", "4", "10"]
    assert [pick(f"rank-{k}", prompt) for k in range(4)] == ["B", "C", "A", "D"]  # numeric
    assert pick("longest", prompt) == "D" and pick("letter-C", prompt) == "C"
    codes = "(A) K7QX\n(B) K7QA\n(C) K7MX\n(D) W9PP"
    assert pick("medoid", codes) == "A" and pick("outlier", codes) == "D"
    assert pick("consensus", codes) == "A"
    with pytest.raises(InvalidConfigError, match="medoid"):
        ShortcutPolicy({"label": "closest"})
