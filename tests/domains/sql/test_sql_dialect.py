"""SQLite → DuckDB rewrites of gold queries: each one run on both engines."""

from __future__ import annotations

import sqlite3

import duckdb
import pytest

from vt_envs.domains.sql.dialect import TranspileError, sqlite_to_duckdb

SCHEMA = {"t": {"a": "BIGINT", "b": "BIGINT", "x": "DOUBLE", "s": "VARCHAR"}}
ROWS = [(7, 2, 1.5, "Paris"), (-7, 2, 2.5, "paris"), (5, 0, 3.5, "Rome")]


@pytest.fixture
def engines():
    lite = sqlite3.connect(":memory:")
    duck = duckdb.connect()
    for con in (lite, duck):
        con.execute("CREATE TABLE t (a BIGINT, b BIGINT, x DOUBLE, s VARCHAR)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", ROWS)
    yield lite, duck
    lite.close()
    duck.close()


@pytest.mark.parametrize(
    ("sql", "rewrite"),
    [
        ("SELECT s FROM t WHERE s LIKE 'PAR%' ORDER BY a", "ilike"),
        ("SELECT a / b, a / 2, x / 2 FROM t ORDER BY a", "int_division"),  # 7/2=3, -7/2=-3, 5/0
        ('SELECT a FROM t WHERE s = "Rome"', "string_literal"),
        ("SELECT s, max(x) FROM t", "bare_column"),
        ("SELECT s, min(a) FROM t", "bare_column"),
    ],
)
def test_rewrite_gives_sqlites_result_on_duckdb(engines, sql, rewrite):
    lite, duck = engines
    carried = sqlite_to_duckdb(sql, SCHEMA)
    assert rewrite in carried.rewrites
    assert duck.execute(carried.sql).fetchall() == lite.execute(sql).fetchall()


def test_integer_division_truncates_where_a_cast_would_round(engines):
    # sqlglot alone writes CAST(a / b AS BIGINT), which rounds 3.5 to 4 on DuckDB.
    carried = sqlite_to_duckdb("SELECT a / b FROM t WHERE a = 7", SCHEMA)
    assert "//" in carried.sql and "CAST" not in carried.sql
    assert engines[1].execute(carried.sql).fetchall() == [(3,)]


def test_bare_column_without_max_or_min_offers_both_extremes():
    sql = "SELECT s, count(*) FROM t GROUP BY b"
    picks = {bare: sqlite_to_duckdb(sql, SCHEMA, bare=bare) for bare in ("any_value", "min", "max")}
    assert "ANY_VALUE(s)" in picks["any_value"].sql
    assert "MIN(s)" in picks["min"].sql and "MAX(s)" in picks["max"].sql
    assert picks["min"].rewrites == ("bare_column_any",)


def test_names_and_grouped_columns_are_left_alone():
    carried = sqlite_to_duckdb('SELECT "s", count(*) FROM t GROUP BY "s"', SCHEMA)
    assert carried.rewrites == ()
    assert carried.sql == 'SELECT "s", COUNT(*) FROM t GROUP BY "s"'


def test_unparsable_sql_is_a_typed_error():
    with pytest.raises(TranspileError):
        sqlite_to_duckdb("SELECT FROM WHERE (", SCHEMA)
    with pytest.raises(TranspileError, match="one statement"):
        sqlite_to_duckdb("SELECT 1; SELECT 2", SCHEMA)
