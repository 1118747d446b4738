"""ExecutionMatch on known (gold, answer) pairs, and the result comparison rules."""

from __future__ import annotations

import datetime
import decimal

import duckdb
import pytest

from vt_envs.core.task import Task
from vt_envs.domains.sql.verifier import (
    ExecutionMatch,
    extract_sql,
    has_top_level_order_by,
    results_match,
)


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("verifier") / "tiny.duckdb"
    con = duckdb.connect(str(path))
    con.execute(
        """
        CREATE TABLE emp (id INTEGER, name VARCHAR, dept VARCHAR, salary DOUBLE, hired DATE);
        INSERT INTO emp VALUES
          (1, 'Ada', 'eng', 120.5, '2020-01-01'), (2, 'Bob', 'eng', 99.25, '2021-06-01'),
          (3, 'Cy', 'ops', 80.0, '2019-03-15'), (4, 'Di', 'ops', 80.0, '2022-11-30'),
          (5, 'Ed', 'hr', NULL, '2018-07-07');
        CREATE TABLE dept (name VARCHAR, floor INTEGER);
        INSERT INTO dept VALUES ('eng', 3), ('ops', 1), ('hr', 2);
        """
    )
    con.close()
    return str(path)


# (gold, answer, expected score)
PAIRS = [
    # identical and trivially equivalent
    ("SELECT name FROM emp WHERE dept = 'eng'", "SELECT name FROM emp WHERE dept = 'eng'", 1.0),
    ("SELECT name FROM emp WHERE dept = 'eng'", "select NAME from EMP where DEPT='eng';", 1.0),
    ("SELECT name FROM emp WHERE dept = 'eng'", "SELECT name FROM emp WHERE id IN (1, 2)", 1.0),
    # no ORDER BY in gold: row order does not matter
    (
        "SELECT name FROM emp WHERE dept = 'ops'",
        "SELECT name FROM emp WHERE dept = 'ops' ORDER BY name DESC",
        1.0,
    ),
    # ORDER BY in gold: order matters
    ("SELECT name FROM emp ORDER BY id", "SELECT name FROM emp ORDER BY id", 1.0),
    ("SELECT name FROM emp ORDER BY id", "SELECT name FROM emp ORDER BY id DESC", 0.0),
    # ORDER BY only inside a window / subquery: order does not matter
    (
        "SELECT name, ROW_NUMBER() OVER (ORDER BY id) AS r FROM emp",
        "SELECT name, ROW_NUMBER() OVER (ORDER BY id) FROM emp ORDER BY name DESC",
        1.0,
    ),
    # multisets: duplicates count
    (
        "SELECT salary FROM emp WHERE dept = 'ops'",
        "SELECT DISTINCT salary FROM emp WHERE dept = 'ops'",
        0.0,
    ),
    ("SELECT dept FROM emp", "SELECT dept FROM emp UNION ALL SELECT 'eng'", 0.0),
    # numbers across types and float tolerance
    ("SELECT COUNT(*) FROM emp", "SELECT 5.0", 1.0),
    (
        "SELECT AVG(salary) FROM emp WHERE dept = 'eng'",
        "SELECT SUM(salary) / 2 FROM emp WHERE dept = 'eng'",
        1.0,
    ),
    ("SELECT SUM(salary) FROM emp", "SELECT CAST(379.75 AS DECIMAL(10, 2))", 1.0),
    ("SELECT SUM(salary) FROM emp", "SELECT 379.76", 0.0),
    ("SELECT 0.1 + 0.2", "SELECT 0.3", 1.0),
    # NULLs
    ("SELECT salary FROM emp WHERE name = 'Ed'", "SELECT NULL", 1.0),
    ("SELECT salary FROM emp WHERE name = 'Ed'", "SELECT 0", 0.0),
    # wrong columns / extra columns
    ("SELECT name FROM emp WHERE dept = 'eng'", "SELECT name, id FROM emp WHERE dept = 'eng'", 0.0),
    ("SELECT name, dept FROM emp", "SELECT dept, name FROM emp", 0.0),
    # strings are case-sensitive
    ("SELECT name FROM emp WHERE id = 1", "SELECT 'ada'", 0.0),
    # dates compare with their ISO text
    ("SELECT hired FROM emp WHERE id = 3", "SELECT '2019-03-15'", 1.0),
    # joins vs subqueries
    (
        "SELECT e.name FROM emp e JOIN dept d ON e.dept = d.name WHERE d.floor > 1",
        "SELECT name FROM emp WHERE dept IN (SELECT name FROM dept WHERE floor > 1)",
        1.0,
    ),
    # empty results match empty results
    ("SELECT name FROM emp WHERE salary > 1000", "SELECT name FROM emp WHERE 1 = 0", 1.0),
    ("SELECT name FROM emp WHERE salary > 1000", "SELECT 'nobody'", 0.0),
    # answers that fail score 0
    ("SELECT COUNT(*) FROM emp", "SELECT COUNT(*) FROM employees", 0.0),
    ("SELECT COUNT(*) FROM emp", "SELECT COUNT(*) FROM emp; SELECT 1", 0.0),
    ("SELECT COUNT(*) FROM emp", "DELETE FROM emp", 0.0),
    ("SELECT COUNT(*) FROM emp", "", 0.0),
    ("SELECT COUNT(*) FROM emp", "SELECT COUNT(*) FROM range(100000) a, range(100000) b", 0.0),
    # Markdown fences are accepted
    ("SELECT COUNT(*) FROM emp", "```sql\nSELECT COUNT(*) FROM emp\n```", 1.0),
]


@pytest.mark.parametrize(("gold", "answer", "expected"), PAIRS)
def test_known_pairs(tiny_db, gold, answer, expected):
    verifier = ExecutionMatch(timeout_s=0.5)
    task = Task("t", "q", gold=gold, assets={"db_path": tiny_db})
    score = verifier(task, answer)
    assert score.value == expected, score.detail
    assert score.parts["correct"] == expected
    assert gold not in score.detail


def test_column_order_insensitive_option(tiny_db):
    task = Task("t", "q", gold="SELECT name, dept FROM emp", assets={"db_path": tiny_db})
    lenient = ExecutionMatch(column_order_insensitive=True)
    assert ExecutionMatch()(task, "SELECT dept, name FROM emp").value == 0.0
    assert lenient(task, "SELECT dept, name FROM emp").value == 1.0
    assert lenient(task, "SELECT dept, dept FROM emp").value == 0.0


def test_failure_detail_names_the_error_kind_only(tiny_db):
    task = Task("t", "q", gold="SELECT 1", assets={"db_path": tiny_db})
    # A long scan in constant memory: it can only time out (a cross join of two
    # ranges may hit the memory limit first, a race with the deadline).
    slow = "SELECT COUNT(*) FROM range(1000000000000) t(x) WHERE x % 7 = 3"
    score = ExecutionMatch(timeout_s=0.3)(task, slow)
    assert (score.value, score.parts["executed"]) == (0.0, 0.0)
    assert score.detail == "answer failed: timeout"


def test_gold_results_are_cached_in_the_worker(tiny_db):
    from vt_envs.domains.sql import worker

    handle = worker.serve({})
    request = {
        "op": "verify",
        "db": tiny_db,
        "gold": "SELECT COUNT(*) FROM emp",
        "answer": "SELECT COUNT(*) FROM emp",
        "timeout_s": 5,
        "max_result_rows": 100,
        "order_matters": False,
        "column_order_insensitive": False,
        "rel_tol": 1e-6,
        "abs_tol": 1e-9,
    }
    assert handle(request)["value"] == 1.0
    cached = dict(handle.gold_cache)
    assert handle({**request, "answer": "SELECT 0"})["value"] == 0.0
    (key,) = cached
    assert handle.gold_cache[key] is cached[key]  # the gold ran once


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order\n  by a limit 3", True),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a) s", False),
        ("SELECT ROW_NUMBER() OVER (ORDER BY a) FROM t", False),
        ("SELECT 'ORDER BY x' FROM t", False),
        ('SELECT "order by" FROM t', False),
        ("SELECT a FROM t -- ORDER BY a", False),
        ("WITH c AS (SELECT a FROM t ORDER BY a) SELECT * FROM c ORDER BY 1", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("SELECT a FROM t WHERE b = 'it''s (' ORDER BY a", True),
    ],
)
def test_has_top_level_order_by(sql, expected):
    assert has_top_level_order_by(sql) is expected


def test_results_match_rules():
    assert results_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")])
    assert not results_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], order_matters=True)
    assert results_match([(decimal.Decimal("1.50"),)], [(1.5,)])
    assert results_match([(datetime.date(2020, 1, 2),)], [("2020-01-02",)])
    assert results_match([(1.0000001,)], [(1.0,)])
    assert not results_match([(1.001,)], [(1.0,)])
    assert results_match([(True,)], [(1,)])
    assert not results_match([(1,)], [(1,), (1,)])
    assert results_match([], [])
    assert results_match([(1, 2), (3, 4)], [(2, 1), (4, 3)], column_order_insensitive=True)
    assert not results_match([(1, 2), (3, 4)], [(2, 1), (3, 4)], column_order_insensitive=True)


def test_extract_sql():
    assert extract_sql("  SELECT 1; ") == "SELECT 1;"
    assert extract_sql("Here:\n```sql\nSELECT 2\n```\nDone") == "SELECT 2"
    assert extract_sql("```\nSELECT 3\n```") == "SELECT 3"
