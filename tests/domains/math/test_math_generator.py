"""The embedded generator: determinism, disjoint splits, exact answers, solution code."""

from __future__ import annotations

import contextlib
import io
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
    task = math_tasks("train")[0]
    assert task.prompt == "What is C(280, 76) (the binomial coefficient) modulo 1000000?"
    assert task.gold == "381200"
    assert task.metadata == {"family": "binomial_mod", "difficulty": 2, "source": "generated"}


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
        assert tasks[i].gold not in map(str, tasks[i].metadata.values())
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
