"""The embedded generator: determinism, disjoint splits, exact answers, solution code."""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import re
from fractions import Fraction

import pytest

from vt_envs.domains.math.generator import (
    DIFFICULTIES,
    FAMILIES,
    format_exact,
    format_fraction,
    generate_problem,
    math_tasks,
)
from vt_envs.domains.math.verifier import MathVerifier
from vt_envs.errors import InvalidConfigError


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # project-written solution code, not model output
    return out.getvalue().strip()


def test_same_index_gives_same_task_across_instances():
    a, b = math_tasks("train"), math_tasks("train")
    assert [a[i] for i in range(20)] == [b[i] for i in range(20)]
    assert a[3].id == "math/train/3"


def test_known_first_task_is_stable():
    # Pins the generator's output: a change here changes every task id's meaning.
    # (The default mix drew from 12 families before issue 31 added five; this task changed then.)
    task = math_tasks("train")[0]
    assert task.prompt.startswith("The Collatz map sends n to n/2 if n is even")
    assert "every starting value from 2699 to 2922 reaches 1" in task.prompt
    assert task.gold == "2919"
    assert task.metadata == {"family": "property_check", "difficulty": 2, "source": "generated"}


def test_an_explicit_family_list_draws_what_it_drew_before_the_new_families():
    # Recipes name families (configs/math_grpo_smollm2_cpu.yaml: digit_sum, modpow; the
    # quickstart: big_product); adding families must not change their tasks.
    task = math_tasks("train", families=["big_product"])[0]
    assert task.prompt == "Compute 34,280,804,238 \u00d7 13,687,617,154 \u00d7 11,487,487,197."
    assert task.gold == "5390187738613355398993813158444"
    mixed = math_tasks("test", families=["digit_sum", "modpow"])[0]
    assert (mixed.prompt, mixed.gold) == (
        "What is the remainder when 14^{99} is divided by 27?",
        "26",
    )


def test_train_and_test_prompts_are_disjoint():
    train = {math_tasks("train")[i].prompt for i in range(1500)}
    test = {math_tasks("test")[i].prompt for i in range(500)}
    assert not train & test
    assert len(test) > 450  # few repeats inside the held-out split


def test_default_sizes():
    assert len(math_tasks("train")) == 10_000
    assert len(math_tasks("test")) == 500


def test_every_family_and_level_appears():
    tasks = math_tasks("train")
    seen = {(tasks[i].metadata["family"], tasks[i].metadata["difficulty"]) for i in range(1500)}
    assert seen == {(f, d) for f in FAMILIES for d in DIFFICULTIES}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("level", DIFFICULTIES)
def test_solution_code_prints_the_gold(family, level):
    for index in range(3):
        problem = generate_problem("train", index, families=[family], difficulties=[level])
        assert problem.family == family and problem.difficulty == level
        assert _run(problem.solution_code) == problem.answer, problem.prompt


def test_gold_is_accepted_by_the_verifier_fast_path():
    verifier = MathVerifier()
    tasks = math_tasks("test")
    for i in range(100):
        assert verifier.compare(tasks[i].gold, tasks[i].gold) == (True, "exact")


def test_metadata_never_holds_the_gold():
    tasks = math_tasks("train")
    for i in range(50):
        # (difficulty is a level 1-3; a gold of "1" equal to it is no leak)
        meta = tasks[i].metadata
        assert tasks[i].gold not in (meta["family"], meta["source"])
        assert set(tasks[i].metadata) == {"family", "difficulty", "source"}


def test_filters_restrict_families_and_levels_and_tag_ids():
    tasks = math_tasks("train", families=["modpow"], difficulty=3, size=5)
    assert {t.metadata["family"] for t in tasks} == {"modpow"}
    assert {t.metadata["difficulty"] for t in tasks} == {3}
    assert tasks[0].id == "math/train/0/modpow/d3"
    assert len(tasks) == 5


@pytest.mark.parametrize("kwargs", [{"families": ["nope"]}, {"difficulty": 4}, {"families": []}])
def test_bad_filters_raise(kwargs):
    with pytest.raises(InvalidConfigError):
        math_tasks("train", **kwargs)


def test_bad_split_raises():
    with pytest.raises(InvalidConfigError, match="split"):
        math_tasks("validation")


@pytest.mark.parametrize(
    "value, exact, fraction",
    [
        (Fraction(12), "12", "12"),
        (Fraction(25, 2), "12.5", "25/2"),
        (Fraction(-13, 4), "-3.25", "-13/4"),
        (Fraction(1, 3), "1/3", "1/3"),
        (Fraction(-1, 7), "-1/7", "-1/7"),
        (Fraction(1, 1_000_000), "0.000001", "1/1000000"),
    ],
)
def test_answer_formats(value, exact, fraction):
    assert format_exact(value) == exact
    assert format_fraction(value) == fraction


# --- issue 31: harder families, checked against independent brute force -----------------

NEW_FAMILIES = (
    "word_inventory",
    "word_savings",
    "property_check",
    "number_theory",
    "combinatorics",
)


def _ints(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, int(n**0.5) + 1))


def _brute(prompt: str) -> int:
    """The answer of a level-1 problem of a new family, by the most naive computation."""
    n = _ints(prompt)
    if prompt.startswith("A warehouse"):
        stock, pct, delivery, months = n
        for _ in range(months):
            stock = stock - stock * pct // 100 + delivery
        return stock
    if prompt.startswith("Ana has"):
        a0, b0, b, a, step = n[:5]
        week, ana, ben = 0, a0, b0
        while ana <= ben:
            week += 1
            ana, ben = ana + a + step * (week - 1), ben + b
        return ana
    if prompt.startswith("Goldbach"):
        lo, hi = n[-2:]
        return sum(
            _is_prime(p) and _is_prime(m - p)
            for m in range(lo, hi + 1, 2)
            for p in range(2, m // 2 + 1)
        )
    if prompt.startswith("The Collatz"):
        lo, hi = map(int, re.search(r"from (\d+) to (\d+)", prompt).groups())

        def steps(k):
            return 0 if k == 1 else 1 + steps(k // 2 if k % 2 == 0 else 3 * k + 1)

        return max(range(lo, hi + 1), key=lambda k: (steps(k), -k))
    if "a^2 + b^2" in prompt:
        lo, hi = n[0], n[1]
        return sum(
            any(round((k - a * a) ** 0.5) ** 2 == k - a * a for a in range(int(k**0.5) + 1))
            for k in range(lo, hi + 1)
        )
    if "lcm(a, b)" in prompt:
        m = n[-1]
        return sum(
            a * b // math.gcd(a, b) == m
            for a in range(1, m + 1)
            if m % a == 0
            for b in range(1, m + 1)
            if m % b == 0
        )
    if "coprime to" in prompt:
        top, m = n[-2:]
        return sum(math.gcd(k, m) == 1 for k in range(1, top + 1))
    if "digits summing to" in prompt:
        top, s = n[-2:]
        return sum(sum(map(int, str(k))) == s for k in range(1, top + 1))
    if prompt.startswith("In how many ways"):
        total, *coins = n
        coins = coins[: len(coins)]
        return _change(total, tuple(coins))
    if prompt.startswith("How many subsets"):
        *items, k = n
        return sum(
            sum(c) % k == 0 for r in range(len(items) + 1) for c in itertools.combinations(items, r)
        )
    if prompt.startswith("A path"):
        a, b = map(int, re.search(r"to \((\d+), (\d+)\)", prompt).groups())
        cells = _ints(prompt.split("pass through")[1])
        blocked = set(zip(cells[::2], cells[1::2]))
        return sum(
            all(p not in blocked for p in _walk(rights, a + b))
            for rights in itertools.combinations(range(a + b), a)
        )
    raise AssertionError(prompt)


def _change(total: int, coins: tuple[int, ...]) -> int:
    if not coins:
        return int(total == 0)
    return sum(_change(total - k * coins[0], coins[1:]) for k in range(total // coins[0] + 1))


def _walk(rights: tuple[int, ...], length: int) -> list[tuple[int, int]]:
    x = y = 0
    points = [(0, 0)]
    for i in range(length):
        x, y = (x + 1, y) if i in rights else (x, y + 1)
        points.append((x, y))
    return points


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_new_families_golds_match_a_naive_computation(family):
    for index in range(12):
        problem = generate_problem("train", index, families=[family], difficulties=[1])
        assert problem.answer == str(_brute(problem.prompt)), problem.prompt


def test_the_harder_families_are_in_the_default_mix_and_the_old_names_kept():
    assert set(NEW_FAMILIES) < set(FAMILIES)
    assert {"big_product", "modpow", "digit_sum", "lcm_range"} < set(FAMILIES)
    tasks = math_tasks("train")
    seen = {tasks[i].metadata["family"] for i in range(300)}
    assert set(NEW_FAMILIES) <= seen


@pytest.mark.slow
def test_train_has_at_least_99_percent_distinct_prompts_at_10000_tasks():
    # 9,655 of 10,000 before issue 31; 9,910 after (lcm_range/binomial_mod level 1 widened).
    tasks = math_tasks("train", size=10_000)
    prompts = {tasks[i].prompt for i in range(10_000)}
    assert len(prompts) >= 9_900, len(prompts)
