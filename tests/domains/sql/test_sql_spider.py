"""The Spider/BIRD loader: SQLite → DuckDB conversion, keys, dialect, gold checks."""

from __future__ import annotations

import pytest

import vt_envs
from vt_envs.domains.sql import SQLOracle, make_sql_env
from vt_envs.domains.sql.databases import connect_readonly
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
    assert tasks.ids() == ["dev/0", "dev/7"]
    assert "dropped 1 of 3 records" in caplog.text
    bird = tasks.get("dev/7")
    assert bird.gold.startswith('SELECT "Hall Name", capacity FROM "Concert Hall"')
    assert "Hint: Joe is the name of a singer" in bird.prompt
    assert "FOREIGN KEY (singer_id) REFERENCES singer(singer_id)" in bird.prompt
    assert "-- 1 | Arena | 1 | 5000" in bird.prompt
    assert bird.metadata == {"db_id": "concert", "source": "dev", "difficulty": "simple"}
    assert bird.gold not in bird.prompt


def test_loader_gold_error_modes(spider_files):
    assert len(_load(spider_files, on_gold_error="keep")) == 3
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
