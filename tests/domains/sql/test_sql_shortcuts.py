"""Shortcut baselines of VT-SQL-v0 through gym.make: answers that never query the
database stay near zero on held-out questions.

The bound, 0.10: chance is 0 for an open-ended query (an oracle scores 1.0), but a
few questions have a genuinely common answer: small counts (1, 2) of a template's
filters, which a per-template most-common answer learns from train. On `shop` it
scores 0.060 on 300 test questions and 0.075 on the 40 of the fast test (3 hits; one
hit is 2.5 points here), so the bound leaves one or two hits of room and no more.
An empty-result gold would make the empty query a free 1.0, so the question bank
refuses them (and the Spider loader does too: test_sql_spider.py).
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.domains.sql.shortcuts import (
    EMPTY_QUERY,
    ConstantQueryPolicy,
    MostCommonAnswerPolicy,
    answer_query,
    fit_most_common,
)
from vt_envs.domains.sql.tasks import sql_tasks

BOUND = 0.10


def _score(policy, databases, n):
    env = gym.make("VT-SQL-v0", split="test", databases=databases, size_per_database=n)
    try:
        ids = env.unwrapped.tasks.ids()
        rewards = [vt_envs.run_episode(env, policy, options={"task_id": i}).reward for i in ids]
    finally:
        env.close()
    return sum(rewards) / len(rewards)


def _policies(databases, fit):
    train = sql_tasks("train", databases=databases, size_per_database=fit)
    table = fit_most_common(train[i] for i in range(len(train)))
    return {
        "empty": ConstantQueryPolicy(),
        "zero": ConstantQueryPolicy("SELECT 0"),
        "one": ConstantQueryPolicy("SELECT 1"),
        "most-common": MostCommonAnswerPolicy(table),
    }


def test_answer_query_returns_its_rows():
    con = __import__("duckdb").connect()
    rows = [(1, "a", None), (2.5, "it's", 3)]
    assert con.execute(answer_query(rows)).fetchall() == rows
    assert con.execute(answer_query([(0,)])).fetchall() == [(0,)]
    assert con.execute(EMPTY_QUERY).fetchall() == []


def test_shortcuts_stay_near_zero_on_shop(sql_cache):
    for name, policy in _policies(("shop",), fit=100).items():
        score = _score(policy, ("shop",), 40)
        assert score <= BOUND, (name, score)


@pytest.mark.slow
def test_shortcuts_stay_near_zero_on_every_database(sql_cache):
    databases = ("flights", "tpch", "shop")
    for name, policy in _policies(databases, fit=400).items():
        score = _score(policy, databases, 100)
        assert score <= BOUND, (name, score)
