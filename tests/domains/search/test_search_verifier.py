"""AnswerMatch: SQuAD normalization, EM / F1 / substring EM over every gold."""

from __future__ import annotations

import pytest

from vt_envs.core.task import Task
from vt_envs.domains.search.verifier import (
    AnswerMatch,
    exact_match,
    normalize_answer,
    substring_match,
    token_f1,
)
from vt_envs.errors import InvalidConfigError


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   Apple, a day ", "apple day"),
        ("“Théâtre” — d’Orsay", "théâtre dorsay"),
        ("Anne of the Thousand Days", "anne of thousand days"),
        ("1902.", "1902"),
    ],
)
def test_squad_normalization(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_takes_the_best_gold():
    assert exact_match("the United States", ["USA", "United States"]) == 1.0
    assert exact_match("United States of America", ["USA", "United States"]) == 0.0


def test_substring_match_is_on_word_boundaries():
    assert substring_match("It was built in 1902 by the British", ["1902"]) == 1.0
    assert substring_match("19021", ["1902"]) == 0.0
    assert substring_match("anything", [""]) == 0.0


def test_token_f1_known_values():
    assert token_f1("Stanley Kubrick", ["Kubrick"]) == pytest.approx(2 / 3)
    assert token_f1("Kubrick", ["Stanley Kubrick", "Kubrick"]) == 1.0
    assert token_f1("Spielberg", ["Kubrick"]) == 0.0


def test_answer_match_reports_every_metric_and_scores_by_the_chosen_one():
    task = Task("t", "q", gold=["Stanley Kubrick"])
    em = AnswerMatch()(task, "Kubrick")
    assert em.value == 0.0
    assert em.parts == {"em": 0.0, "f1": pytest.approx(2 / 3), "substring_em": 0.0}
    assert AnswerMatch("f1")(task, "Kubrick").value == pytest.approx(2 / 3)
    assert AnswerMatch("substring_em")(task, "director Stanley Kubrick").value == 1.0
    assert AnswerMatch()(Task("n", "q", gold=1902), "1902").value == 1.0
    with pytest.raises(InvalidConfigError, match="metric must be one of"):
        AnswerMatch("bleu")
