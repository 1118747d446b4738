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
    assert all(split_of(q.sql, q.template.held_out) == "test" for q in test)
    assert all(split_of(q.sql) == "train" and not q.template.held_out for q in train)
    fresh = QuestionBank(db, str(db_paths[db]))  # same questions in a new process
    try:
        assert [fresh.question("test", k).sql for k in range(15)] == [q.sql for q in test]
        assert fresh.question("train", 39).sql == train[39].sql
    finally:
        fresh.close()


def test_first_questions_are_pinned(banks):
    """Task ids must keep naming the same questions; a change here is a version bump
    (changed once, for issue 31: held-out templates, more templates, cancelled flights)."""
    assert (
        banks["shop"]
        .question("test", 0)
        .sql.startswith(
            "WITH rev AS (SELECT p.category, p.product_id, p.name, SUM(oi.quantity * oi.unit_price)"
        )
    )
    assert banks["tpch"].question("test", 0).template.id == "tpch/priority_counts"


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


def test_some_templates_are_held_out_for_test(banks):
    """The test split holds out kinds of question, not only constants: every database
    has templates train never draws, and they appear in its first test questions."""
    for db, bank in banks.items():
        held_out = {t.id for t in TEMPLATES[db] if t.held_out}
        assert held_out, db
        assert len(held_out) < len(TEMPLATES[db]) / 3, db  # train keeps most kinds
        train = {bank.question("train", k).template.id for k in range(60)}
        test = {bank.question("test", k).template.id for k in range(30)}
        assert not train & held_out, db
        assert test & held_out, db


def test_flights_that_flew_exclude_cancelled_ones(banks):
    """ "How many flights flew" must not count cancelled flights (no departure time)."""
    bank = banks["flights"]
    origin, dest, month, flown = bank._con.execute(
        "SELECT origin, dest, month, COUNT(dep_time) FROM flights GROUP BY ALL "
        "ORDER BY COUNT(*) - COUNT(dep_time) DESC, 1, 2, 3 LIMIT 1"
    ).fetchone()
    template = next(t for t in TEMPLATES["flights"] if t.id == "flights/route_count")
    params = {"origin": origin, "dest": dest, "month": month, "month_name": "x"}
    question, sql = template.render(params)
    assert "flew" in question
    assert bank._con.execute(sql).fetchall() == [(flown,)]
