"""Templated questions: checked by execution, graded, stable, with a disjoint test split."""

from __future__ import annotations

from random import Random

import pytest

from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.questions import (
    DIFFICULTIES,
    TEMPLATES,
    QuestionBank,
    check_gold,
    split_of,
)


@pytest.fixture(scope="module")
def banks(db_paths):
    made = {name: QuestionBank(name, str(db_paths[name])) for name in TEMPLATES}
    yield made
    for bank in made.values():
        bank.close()


def test_templates_cover_every_difficulty_and_the_listed_skills():
    templates = [t for group in TEMPLATES.values() for t in group]
    assert {t.difficulty for t in templates} == set(DIFFICULTIES)
    skills = {s for t in templates for s in t.skills}
    assert {"filter", "join", "aggregation", "grouping", "ordering", "nested", "window"} <= skills
    for db, group in TEMPLATES.items():
        assert {t.difficulty for t in group} == set(DIFFICULTIES), db
        assert len({t.id for t in group}) == len(group)


@pytest.mark.parametrize("db", sorted(TEMPLATES))
def test_every_template_yields_checked_questions(banks, db):
    bank = banks[db]
    for template in TEMPLATES[db]:
        good = 0
        for seed in range(6):
            question, sql = template.render(template.sample(bank.pools, Random(seed)))
            good += check_gold(bank._con, sql, question) is None
        assert good >= 2, template.id


@pytest.mark.parametrize("db", sorted(TEMPLATES))
def test_splits_are_disjoint_distinct_and_stable(banks, db_paths, db):
    bank = banks[db]
    test = [bank.question("test", k) for k in range(15)]
    train = [bank.question("train", k) for k in range(40)]
    assert len({q.sql for q in test}) == 15
    assert not {q.sql for q in test} & {q.sql for q in train}
    assert all(split_of(q.sql) == "test" for q in test)
    assert all(split_of(q.sql) == "train" for q in train)
    fresh = QuestionBank(db, str(db_paths[db]))  # same questions in a new process
    try:
        assert [fresh.question("test", k).sql for k in range(15)] == [q.sql for q in test]
        assert fresh.question("train", 39).sql == train[39].sql
    finally:
        fresh.close()


def test_first_questions_are_pinned(banks):
    """Task ids must keep naming the same questions; a change here is a version bump."""
    assert (
        banks["shop"]
        .question("test", 0)
        .sql.startswith(
            "SELECT name FROM products WHERE category = 'Books' AND price > (SELECT AVG(price)"
        )
    )
    assert banks["tpch"].question("test", 0).template.id == "tpch/shipmode_revenue"


def test_check_gold_rejects_unusable_queries(db_paths):
    con = connect_readonly(db_paths["shop"])
    try:
        assert check_gold(con, "SELECT COUNT(*) FROM orders", "How many orders?") is None
        assert check_gold(con, "SELECT * FROM orders WHERE 1 = 0", "q") == "empty result"
        assert check_gold(con, "SELECT NULL", "q") == "empty result"
        assert check_gold(con, "SELECT random()", "q") == "nondeterministic result"
        assert check_gold(con, "SELECT 3000", "Is it 3000?") == "answer appears in the question"
        assert check_gold(con, "SELECT COUNT(*) FROM orders", "More than 3000 orders?") == (
            "answer appears in the question"
        )
        assert check_gold(con, "SELECT 30", "Is it 3000?") is None
        assert check_gold(con, "SELECT * FROM nope", "q").startswith("gold failed: catalog_error")
        assert check_gold(con, "SELECT 1; SELECT 2", "q").startswith("gold failed: multiple")
    finally:
        con.close()
