"""Fixtures of the SQL domain tests: a private cache dir, the embedded databases,
and a tiny Spider-format dataset."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sql_cache(tmp_path_factory: pytest.TempPathFactory):
    """A session-wide cache dir for the SQL tests, so they build the databases once and
    never touch the user's cache; it is ``VT_CACHE_DIR`` only while a SQL test runs
    (:func:`_sql_cache_env`), so later tests keep their own cache."""
    return tmp_path_factory.mktemp("vt_cache")


@pytest.fixture(autouse=True)
def _sql_cache_env(sql_cache, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VT_CACHE_DIR", str(sql_cache))


@pytest.fixture(scope="session")
def db_paths(sql_cache) -> dict[str, Path]:
    from vt_envs.domains.sql.databases import EMBEDDED_DATABASES, database_path

    with pytest.MonkeyPatch.context() as patch:  # session fixtures run before autouse ones
        patch.setenv("VT_CACHE_DIR", str(sql_cache))
        return {name: database_path(name) for name in EMBEDDED_DATABASES}


def make_spider_fixture(root: Path) -> dict[str, str]:
    """A tiny Spider/BIRD-format dataset: one SQLite db, tables.json, dev.json."""
    db_dir = root / "database" / "concert"
    db_dir.mkdir(parents=True)
    con = sqlite3.connect(db_dir / "concert.sqlite")
    con.executescript(
        """
        CREATE TABLE singer (singer_id INT PRIMARY KEY, name TEXT, country TEXT, age INT,
                             net_worth REAL);
        CREATE TABLE "Concert Hall" (hall_id INTEGER PRIMARY KEY, "Hall Name" TEXT,
                             singer_id INT, capacity INT,
                             FOREIGN KEY (singer_id) REFERENCES singer(singer_id));
        INSERT INTO singer VALUES (1, 'Joe', 'France', 52, 1.5), (2, 'Ann', 'Netherlands', 32, 2),
                                  (3, 'Tim', 'France', 'unknown', NULL);
        INSERT INTO "Concert Hall" VALUES (1, 'Arena', 1, 5000), (2, 'Club', 2, 300),
                                          (3, 'Dome', 1, 20000);
        """
    )
    con.commit()
    con.close()
    questions = [
        {
            "question": "How many singers are from France?",
            "query": "SELECT count(*) FROM singer WHERE country = 'France'",
            "db_id": "concert",
        },
        {
            "question": "What are the names and capacities of the halls of Joe?",
            "SQL": "SELECT `Hall Name`, capacity FROM `Concert Hall` AS h JOIN singer AS s "
            "ON h.singer_id = s.singer_id WHERE s.name = 'Joe'",
            "evidence": "Joe is the name of a singer",
            "db_id": "concert",
            "question_id": 7,
            "difficulty": "simple",
        },
        {
            "question": "Uses a SQLite-only function",
            "query": "SELECT julianday('now') - julianday(name) FROM singer",
            "db_id": "concert",
        },
        # The review's cases: golds whose DuckDB meaning differs unless rewritten.
        {
            "question": "Which singers are from France?",
            "query": "SELECT name FROM singer WHERE country LIKE 'france'",  # case-insensitive
            "db_id": "concert",
            "question_id": "like",
        },
        {
            "question": "What is the average hall capacity, as a whole number?",
            "query": 'SELECT sum(capacity) / count(*) FROM "Concert Hall"',  # 25300 / 3 = 8433
            "db_id": "concert",
            "question_id": "int_division",
        },
        {
            "question": "How many singers are from the Netherlands?",
            "query": 'SELECT count(*) FROM singer WHERE country = "Netherlands"',  # a string
            "db_id": "concert",
            "question_id": "string_literal",
        },
        {
            "question": "Who is the richest singer, and how rich?",
            "query": "SELECT name, max(net_worth) FROM singer",  # bare column: the max's row
            "db_id": "concert",
            "question_id": "bare_max",
        },
        {
            "question": "Give a singer of each country.",
            "query": "SELECT country, name FROM singer GROUP BY country",  # France: Joe or Tim
            "db_id": "concert",
            "question_id": "bare_ambiguous",
        },
        {
            "question": "Which singers are worth more than 100?",
            "query": "SELECT name FROM singer WHERE net_worth > 100",  # no rows
            "db_id": "concert",
            "question_id": "empty",
        },
        {
            "question": "What type is Joe's net worth stored as?",
            "query": "SELECT typeof(net_worth) FROM singer WHERE name = 'Joe'",  # 'real' / DOUBLE
            "db_id": "concert",
            "question_id": "mismatch",
        },
    ]
    (root / "dev.json").write_text(json.dumps(questions))
    tables = [
        {
            "db_id": "concert",
            "table_names_original": ["singer", "Concert Hall"],
            "column_names_original": [
                [-1, "*"],
                [0, "singer_id"],
                [0, "name"],
                [0, "country"],
                [0, "age"],
                [0, "net_worth"],
                [1, "hall_id"],
                [1, "Hall Name"],
                [1, "singer_id"],
                [1, "capacity"],
            ],
            "primary_keys": [1, 6],
            "foreign_keys": [[8, 1]],
        }
    ]
    (root / "tables.json").write_text(json.dumps(tables))
    return {
        "questions": str(root / "dev.json"),
        "database_dir": str(root / "database"),
        "tables": str(root / "tables.json"),
    }


@pytest.fixture
def spider_files(tmp_path: Path, sql_cache) -> dict[str, str]:
    return make_spider_fixture(tmp_path)
