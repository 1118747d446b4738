"""MathVerifier: known equal and unequal pairs, extraction, the fast path, our own timeout."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from vt_envs.core.task import Task
from vt_envs.domains.math.verifier import (
    MathVerifier,
    extract_final_answer,
    last_boxed,
    parse_plain_number,
)
from vt_envs.errors import InvalidConfigError

EQUAL = [
    # plain numbers (fast path)
    ("42", "42"),
    ("42", "42.0"),
    ("0.5", "1/2"),
    ("1/2", "\\frac{1}{2}"),
    ("\\frac{1}{2}", "0.5"),
    ("-13/4", "-3.25"),
    ("3/7", "\\dfrac{3}{7}"),
    ("1234", "1,234"),
    ("1234567", "1,234,567"),
    ("1234", "1{,}234"),
    ("1234", "1\\,234"),
    ("12", "\\$12"),
    ("12", "$12"),
    ("5", "\\boxed{5}"),
    ("#### 42", "42"),
    ("42", "The answer is #### 42"),
    ("-3", "- 3"),
    ("0.5", ".5"),
    ("7", "7."),
    # math-verify
    ("3/7", "0.428571"),
    ("50\\%", "50"),
    ("50%", "0.5"),
    ("12", "12 cm"),
    ("\\pi", "3.14159265"),
    ("2\\pi", "6.283185"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("[1,2)", "[1,2)"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("1000", "10^{3}"),
    ("5", "x=5"),
    ("2,3", "3,2"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
]

UNEQUAL = [
    ("7", "8"),
    ("1/3", "0.33"),
    ("1/2", "1/3"),
    ("42", "-42"),
    ("1234", "12340"),
    ("(1,2]", "[1,2]"),
    ("1000", "1e3"),
    ("\\pi", "3.14"),
    ("x^2+1", "(x+1)^2"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("50", "5"),
    ("0.5", "0.55"),
    ("3/7", "7/3"),
    ("\\sqrt{2}", "2"),
]


@pytest.fixture(scope="module")
def verifier():
    return MathVerifier()


def test_there_are_at_least_forty_known_pairs():
    assert len(EQUAL) + len(UNEQUAL) >= 40


@pytest.mark.parametrize("gold, answer", EQUAL)
def test_equal_pairs(verifier, gold, answer):
    assert verifier.equivalent(gold, answer), (gold, answer)


@pytest.mark.parametrize("gold, answer", UNEQUAL)
def test_unequal_pairs(verifier, gold, answer):
    assert not verifier.equivalent(gold, answer), (gold, answer)


def test_score_shape(verifier):
    task = Task("t", "q", gold="3/7")
    score = verifier(task, "\\frac{3}{7}")
    assert (score.value, dict(score.parts), score.detail) == (1.0, {"correct": 1.0}, "exact")
    score = verifier(task, "")
    assert (score.value, score.detail) == (0.0, "no answer")


@pytest.mark.parametrize(
    "gold, answer, path",
    [
        ("12", "12", "exact"),
        ("1/3", "0.33", "exact"),
        ("12", "12 cm", "math-verify"),
        ("3/7", "0.428571", "math-verify"),
    ],
)
def test_which_path_decides(verifier, gold, answer, path):
    assert verifier.compare(gold, answer)[1] == path


def test_fast_path_agrees_with_math_verify():
    fast, slow = MathVerifier(), MathVerifier(fast_path=False)
    pairs = [
        ("12", "12.0"),
        ("1/2", "0.5"),
        ("1,234", "1234"),
        ("7", "8"),
        ("1/3", "0.33"),
        ("-13/4", "-3.25"),
        ("2", "2.5"),
    ]
    for gold, answer in pairs:
        assert fast.equivalent(gold, answer) == slow.equivalent(gold, answer), (gold, answer)


def test_timeout_scores_zero_and_worker_recovers():
    verifier = MathVerifier(timeout_s=0.5)
    assert verifier.compare("9", "9^{9^{9^{9}}}") == (False, "timeout")
    assert verifier.compare("12", "12 cm") == (True, "math-verify")


def test_works_outside_the_main_thread(verifier):
    results = []
    thread = threading.Thread(
        target=lambda: results.append(verifier.compare("(x+1)^2", "x^2+2x+1"))
    )
    thread.start()
    thread.join(60)
    assert results == [(True, "math-verify")]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", "42"),
        ("  \\boxed{\\frac{1}{2}} ", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("reasoning #### 1,200", "1,200"),
        ("$x+1$", "x+1"),
        ("\\(3\\)", "3"),
        ("7.", "7"),
        ("\\boxed{unclosed", "\\boxed{unclosed"),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_last_boxed_handles_nesting_and_fbox():
    assert last_boxed("\\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("\\fbox{3}") == "3"
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("12", (Fraction(12), False)),
        ("-1,234.5", (Fraction(-2469, 2), True)),
        ("3/7", (Fraction(3, 7), False)),
        ("\\frac{-3}{7}", (Fraction(-3, 7), False)),
        ("$5", (Fraction(5), False)),
        ("50%", None),
        ("12 cm", None),
        ("1/0", None),
        ("1,23", None),
        ("\\pi", None),
    ],
)
def test_parse_plain_number(text, expected):
    assert parse_plain_number(text) == expected


def test_bad_config_raises():
    with pytest.raises(InvalidConfigError):
        MathVerifier(timeout_s=0)
    with pytest.raises(InvalidConfigError):
        MathVerifier(float_rounding=-1)


@pytest.mark.asyncio
async def test_averify_decides_exact_answers_inline_and_sends_the_rest_to_a_thread(
    verifier, monkeypatch
):
    import asyncio

    threaded: list[str] = []
    real = asyncio.to_thread

    async def spy(func, *args):
        threaded.append(args[1])
        return await real(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    for gold, answer, value in [("12", "\\boxed{12}", 1.0), ("1/3", "0.33", 0.0),
                                ("7", "8", 0.0), ("12", "", 0.0)]:  # fmt: skip
        score = await verifier.averify(Task("t", "q", gold=gold), answer)
        assert score.value == value == verifier(Task("t", "q", gold=gold), answer).value
    assert threaded == []
    score = await verifier.averify(Task("t", "q", gold="12"), "12 cm")
    assert score.value == 1.0 and score.parts == {"correct": 1.0} and threaded == ["12 cm"]


def _last_boxed_by_scanning(text):
    """The definition: from the last command backwards, count depth forward."""
    for command in ("\\boxed{", "\\fbox{"):
        start = text.rfind(command)
        while start != -1:
            depth, i = 1, start + len(command)
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            if depth == 0:
                return text[start + len(command) : i - 1]
            start = text.rfind(command, 0, start)
    return None


def test_last_boxed_agrees_with_its_definition_on_random_braces():
    import random

    from vt_envs.domains.math.verifier import last_boxed

    rng = random.Random(0)
    pieces = ["\\boxed{", "\\fbox{", "{", "}", "1", "x", " "]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        assert last_boxed(text) == _last_boxed_by_scanning(text), text


def test_an_answer_full_of_unclosed_boxes_is_graded_at_once():
    """Linear, not quadratic: 60,000 unclosed \\boxed{ took ~45 s to scan the old way."""
    import time

    import gymnasium as gym

    # A budget the answer fits in: an action over max_episode_tokens is not graded at all.
    env = gym.make("VT-Math-v0", split="test", max_episode_tokens=1 << 20)
    env.reset(seed=0)
    start = time.monotonic()
    _, reward, terminated, _, _ = env.step("<answer>" + "\\boxed{" * 60000 + "</answer>")
    assert terminated and reward == 0.0 and time.monotonic() - start < 10
    env.close()
