"""Each domain's worked examples tell the truth: their calls, replayed through the env's
own tools (``gym.make(...).step``), give the outputs the examples show, and they show
no held-out task's text.

A demonstration that lies about a tool (a stale output, a format the tool no
longer writes) teaches the policy the wrong thing; this is where it goes red.
"""

from __future__ import annotations

import re

import duckdb
import gymnasium as gym
import pytest

import vt_envs  # noqa: F401  (registers the ids)
from vt_envs.core.examples import WorkedExample
from vt_envs.domains.sql.examples import EXAMPLES as SQL_EXAMPLES
from vt_envs.domains.sql.examples import LIBRARY_SQL
from vt_envs.domains.sql.execution import execute_query
from vt_envs.domains.sql.results import render_table


def _replay(env, example: WorkedExample) -> list[str]:
    """The observation text of each of ``example``'s calls, made as actions in an episode."""
    env.reset(seed=0)
    tools = env.unwrapped.tools
    outputs = []
    for call in example.calls:
        tool = tools[call.tool]
        value = call.arguments.get(tool.tag_argument) if tool.tag_argument else None
        action = (
            f"<{call.tool}>{value}</{call.tool}>"
            if value is not None and len(call.arguments) == 1
            else None
        )
        assert action is not None, f"{call} is not a one-argument tag call"
        _, _, terminated, truncated, info = env.step(action)
        assert not (terminated or truncated), info
        assert info["tool"]["ok"], info
        outputs.append(info["message"]["content"])
    return outputs


@pytest.mark.parametrize("env_id", ["VT-Math-v0", "VT-Multi-v0"])
def test_example_outputs_are_what_the_tools_return(env_id):
    env = gym.make(env_id, split="test")
    try:
        examples = env.unwrapped.examples
        assert len(examples) == 2
        for example in examples:
            assert _replay(env, example) == [c.output for c in example.calls], example.question
    finally:
        env.close()


def test_sql_example_outputs_are_what_the_sql_tool_shows():
    """On the examples' own library database, rendered as the sql tool renders results."""
    con = duckdb.connect(":memory:")
    con.execute(LIBRARY_SQL)
    tool = gym.make("VT-SQL-v0").unwrapped.tools["sql"]
    for example in SQL_EXAMPLES:
        for call in example.calls:
            outcome = execute_query(con, call.arguments["query"], timeout_s=5, max_rows=50)
            assert outcome.ok, outcome.message
            shown = render_table(
                outcome.columns,
                outcome.rows,
                outcome.total_rows,
                max_chars=tool.max_chars,
                max_cell_chars=tool.max_cell_chars,
            )
            assert shown == call.output
        # The answer is itself a query; its result answers the question.
        answer = execute_query(con, example.answer, timeout_s=5, max_rows=50)
        assert answer.ok and answer.rows


def test_sql_examples_use_no_database_the_env_serves():
    env = gym.make("VT-SQL-v0", split="test")
    served = {"flights", "tpch", "shop"}
    for example in env.unwrapped.examples:
        assert "Database `library`" in example.question
        assert not any(f"Database `{name}`" in example.question for name in served)
    env.close()


def test_search_example_outputs_are_the_retrievers_and_show_only_train_articles():
    from vt_envs.domains.search.tasks import split_of

    env = gym.make("VT-Search-v0", split="test")
    try:
        examples = env.unwrapped.examples
        assert len(examples) == 2
        for example in examples:
            outputs = _replay(env, example)
            assert outputs == [c.output for c in example.calls], example.question
            titles = [t for o in outputs for t in re.findall(r"\(Title: ([^)]*)\)", o)]
            assert titles and all(split_of(t) == "train" for t in titles), titles
    finally:
        env.close()
