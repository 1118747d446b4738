"""The Spider/BIRD loader: SQLite → DuckDB conversion, keys, dialect, gold checks."""

from __future__ import annotations

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.domains.sql import SQLOracle, make_sql_env
from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.shortcuts import EMPTY_QUERY, ConstantQueryPolicy
from vt_envs.domains.sql.spider import (
    convert_sqlite,
    keys_from_tables_json,
    load_spider,
    sqlite_sql_to_duckdb,
)
from vt_envs.errors import DatasetFormatError, InvalidConfigError


def _load(files, **kwargs):
    return load_spider(
        files["questions"],
        database_dir=files["database_dir"],
        tables_path=files["tables"],
        **kwargs,
    )


def test_conversion_keeps_rows_and_types_follow_the_values(spider_files):
    path, keys = convert_sqlite(f"{spider_files['database_dir']}/concert/concert.sqlite")
    con = connect_readonly(path)
    try:
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'singer'"
            ).fetchall()
        )
        rows = con.execute('SELECT * FROM "Concert Hall" ORDER BY hall_id').fetchall()
        ages = con.execute("SELECT age FROM singer ORDER BY singer_id").fetchall()
    finally:
        con.close()
    assert types == {
        "singer_id": "BIGINT",
        "name": "VARCHAR",
        "country": "VARCHAR",
        "age": "VARCHAR",  # declared INT, but one row holds 'unknown'
        "net_worth": "DOUBLE",
    }
    assert rows == [(1, "Arena", 1, 5000), (2, "Club", 2, 300), (3, "Dome", 1, 20000)]
    assert ages == [("52",), ("32",), ("unknown",)]
    assert keys["Concert Hall"] == {
        "primary_key": ["hall_id"],
        "foreign_keys": [["singer_id", "singer", "singer_id"]],
    }
    again, _ = convert_sqlite(f"{spider_files['database_dir']}/concert/concert.sqlite")
    assert again == path


def test_tables_json_keys():
    entry = {
        "table_names_original": ["a", "b"],
        "column_names_original": [[-1, "*"], [0, "id"], [1, "id"], [1, "a_id"], [1, "k"]],
        "primary_keys": [1, [2, 4]],
        "foreign_keys": [[3, 1]],
    }
    assert keys_from_tables_json(entry) == {
        "a": {"primary_key": ["id"]},
        "b": {"primary_key": ["id", "k"], "foreign_keys": [["a_id", "a", "id"]]},
    }


def test_backquotes_become_double_quotes_outside_strings():
    assert sqlite_sql_to_duckdb("SELECT `a b` FROM `t` WHERE x = 'it''s `raw`';") == (
        "SELECT \"a b\" FROM \"t\" WHERE x = 'it''s `raw`'"
    )


def test_loader_builds_tasks_and_drops_failing_golds(spider_files, caplog):
    tasks = _load(spider_files)
    assert tasks.ids() == [
        "dev/0",
        "dev/7",
        "dev/like",
        "dev/int_division",
        "dev/string_literal",
        "dev/bare_max",
    ]
    assert "dropped 4 of 10 records" in caplog.text
    bird = tasks.get("dev/7")
    assert bird.gold.startswith('SELECT "Hall Name", capacity FROM "Concert Hall"')
    assert "Hint: Joe is the name of a singer" in bird.prompt
    assert "FOREIGN KEY (singer_id) REFERENCES singer(singer_id)" in bird.prompt
    assert "-- 1 | Arena | 1 | 5000" in bird.prompt
    assert bird.metadata == {"db_id": "concert", "source": "dev", "difficulty": "simple"}
    assert bird.gold not in bird.prompt


def test_loader_gold_error_modes(spider_files):
    assert len(_load(spider_files, on_gold_error="keep")) == 10
    with pytest.raises(DatasetFormatError, match="record 2"):
        _load(spider_files, on_gold_error="raise")
    with pytest.raises(InvalidConfigError, match="on_gold_error"):
        _load(spider_files, on_gold_error="ignore")


def test_loader_names_missing_fields(spider_files, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"question": "q", "db_id": "concert"}]')
    with pytest.raises(DatasetFormatError, match="'query'"):
        load_spider(bad, database_dir=spider_files["database_dir"])
    with pytest.raises(DatasetFormatError, match="does not exist"):
        bad.write_text('[{"question": "q", "query": "SELECT 1", "db_id": "nope"}]')
        load_spider(bad, database_dir=spider_files["database_dir"])


def test_oracle_solves_spider_tasks_in_the_env(spider_files):
    env = make_sql_env(spider_files=spider_files, split="test")
    try:
        for task_id in env.tasks.ids():
            result = vt_envs.run_episode(env, SQLOracle(), options={"task_id": task_id})
            assert result.reward == 1.0, task_id
    finally:
        env.close()


def _play(env, sql, task_id):
    return vt_envs.run_episode(env, ConstantQueryPolicy(sql), options={"task_id": task_id}).reward


def test_golds_keep_their_sqlite_results_on_duckdb(spider_files):
    """The review's cases, through gym.make: the answer right under SQLite's reading of
    the gold scores 1.0, DuckDB's literal reading of the same SQLite text scores 0."""
    env = gym.make("VT-SQL-v0", spider_files=spider_files, split="test")
    try:
        right = {
            "dev/like": "SELECT name FROM singer WHERE country ILIKE 'france'",  # Joe, Tim
            "dev/int_division": "SELECT 8433",  # 25300 / 3, truncated as in SQLite
            "dev/string_literal": "SELECT 1",
            "dev/bare_max": "SELECT 'Ann', 2.0",  # the row holding the MAX
        }
        for task_id, sql in right.items():
            assert _play(env, sql, task_id) == 1.0, task_id
        wrong = {
            "dev/like": "SELECT name FROM singer WHERE country LIKE 'france'",  # no rows
            "dev/int_division": 'SELECT sum(capacity) / count(*) FROM "Concert Hall"',
        }
        for task_id, sql in wrong.items():
            assert _play(env, sql, task_id) == 0.0, task_id
    finally:
        env.close()


def test_refused_golds_are_typed_counted_and_logged(spider_files, caplog):
    tasks = _load(spider_files)
    assert {r.index: r.reason for r in tasks.refused} == {
        2: "duckdb_error",
        7: "ambiguous",
        8: "empty_result",
        9: "result_mismatch",
    }
    assert tasks.refusal_counts() == {
        "duckdb_error": 1,
        "ambiguous": 1,
        "empty_result": 1,
        "result_mismatch": 1,
    }
    assert "ambiguous 1, duckdb_error 1, empty_result 1, result_mismatch 1" in caplog.text
    mismatch = tasks.refused[-1]
    assert "'real'" in mismatch.detail and "'DOUBLE'" in mismatch.detail
    assert tasks.rewrites == {"ilike": 1, "int_division": 1, "string_literal": 1, "bare_column": 1}
    kept = {t.id: t.gold for t in (tasks[i] for i in range(len(tasks)))}
    assert kept["dev/like"] == "SELECT name FROM singer WHERE country ILIKE 'france'"
    assert "//" in kept["dev/int_division"]


def test_empty_query_never_scores_on_a_kept_spider_gold(spider_files):
    """An empty query is a shortcut wherever a kept gold's result is empty (it was 1.0 on
    the LIKE gold DuckDB read case-sensitively)."""
    env = gym.make("VT-SQL-v0", spider_files=spider_files, split="test")
    try:
        ids = env.unwrapped.tasks.ids()
        assert "dev/like" in ids
        for task_id in ids:
            assert _play(env, EMPTY_QUERY, task_id) == 0.0, task_id
    finally:
        env.close()
