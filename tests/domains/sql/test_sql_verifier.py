"""ExecutionMatch on known (gold, answer) pairs, and the result comparison rules."""

from __future__ import annotations

import datetime
import decimal
import weakref

import duckdb
import gymnasium as gym
import pytest

import vt_envs
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


def _spy_executions(monkeypatch) -> list[str]:
    from vt_envs.domains.sql import worker

    ran: list[str] = []
    real = worker.execute_query

    def counting(con, sql, **kwargs):
        ran.append(sql)
        return real(con, sql, **kwargs)

    monkeypatch.setattr(worker, "execute_query", counting)
    return ran


def _query(db: str, sql: str, **extra) -> dict:
    return {"op": "query", "db": db, "sql": sql, "timeout_s": 5, "max_rows": 2,
            "max_chars": 9000, "max_cell_chars": 60, "count_limit": 100, **extra}  # fmt: skip


def _verify(db: str, gold: str, answer: str, **extra) -> dict:
    return {"op": "verify", "db": db, "gold": gold, "answer": answer, "timeout_s": 5,
            "max_result_rows": 100, "order_matters": False, "column_order_insensitive": False,
            "rel_tol": 1e-6, "abs_tol": 1e-9, **extra}  # fmt: skip


def test_the_worker_grades_an_answer_it_already_ran_without_running_it(tiny_db, monkeypatch):
    from vt_envs.domains.sql import worker

    ran = _spy_executions(monkeypatch)
    handle = worker.serve({})
    names = "SELECT name FROM emp WHERE dept <> 'hr'"
    shown = handle(_query(tiny_db, names, new_episode=True))
    assert shown["rows"] == 2 and "(showing 2 of 4 rows)" in shown["text"]  # 4 kept, 2 shown
    reply = handle(_verify(tiny_db, "SELECT name FROM emp WHERE salary IS NOT NULL", names,
                           episode=True))  # fmt: skip
    assert reply["value"] == 1.0
    assert ran == [names, "SELECT name FROM emp WHERE salary IS NOT NULL"]  # the gold only
    # Another answer, or a verification outside the episode, runs the SQL.
    handle(_verify(tiny_db, "SELECT 1", "SELECT 2", episode=True))
    handle(_verify(tiny_db, "SELECT 1", names))
    assert ran[2:] == ["SELECT 1", "SELECT 2", names]


def test_a_result_past_the_count_limit_is_not_kept(tiny_db, monkeypatch):
    from vt_envs.domains.sql import worker

    ran = _spy_executions(monkeypatch)
    handle = worker.serve({})
    handle({**_query(tiny_db, "SELECT * FROM range(500)", new_episode=True)})
    handle(_verify(tiny_db, "SELECT * FROM range(500)", "SELECT * FROM range(500)", episode=True,
                   max_result_rows=1000))  # fmt: skip
    assert ran.count("SELECT * FROM range(500)") == 3  # query, gold, answer: nothing kept


def test_new_episode_drops_the_kept_results(tiny_db, monkeypatch):
    from vt_envs.domains.sql import worker

    ran = _spy_executions(monkeypatch)
    handle = worker.serve({})
    handle(_query(tiny_db, "SELECT 7", new_episode=True))
    handle(_verify(tiny_db, "SELECT 7", "SELECT 7", episode=True, new_episode=True))
    assert ran == ["SELECT 7", "SELECT 7", "SELECT 7"]  # query, gold, and the answer again


def test_exact_results_match_without_the_tolerant_comparison(monkeypatch):
    from vt_envs.domains.sql import results

    rows = [(i % 7, f"name {i}", i * 0.5) for i in range(2000)]
    shuffled = rows[::-1]
    calls = []
    real = results._same_rows
    monkeypatch.setattr(results, "_same_rows", lambda *a: calls.append(1) or real(*a))
    assert results.results_match(rows, shuffled)
    assert results.results_match(rows, rows, order_matters=True)
    assert not calls  # decided by the multiset / list equality alone
    assert results.results_match([(1.0000001,)], [(1.0,)]) and calls  # tolerance still applies
    # Equal multisets of values that round alike (6 significant digits) no longer
    # depend on the sort order the tolerant path sees.
    assert results.results_match([(1234565.0,), (1234574.0,)], [(1234574.0,), (1234565.0,)])


def test_a_kept_gold_is_normalized_once():
    from vt_envs.domains.sql.results import ResultRows, results_match

    gold = ResultRows([(decimal.Decimal("1.5"), datetime.date(2020, 1, 2))])
    assert results_match(gold, [(1.5, "2020-01-02")])
    first = gold.normalized
    assert results_match(gold, [(1.5, "2020-01-02")]) and gold.normalized is first


def test_a_large_result_is_not_kept(tiny_db, monkeypatch):
    """Kept results are bounded by size, not rows: 2,000 rows of 8 KB strings (16 MB)
    are run again at verification rather than kept in the episode's worker."""
    from vt_envs.domains.sql import worker

    ran = _spy_executions(monkeypatch)
    handle = worker.serve({})
    wide = "SELECT repeat('x', 8000) || i::VARCHAR AS s FROM range(2000) t(i)"
    handle(_query(tiny_db, wide, new_episode=True, count_limit=10_000))
    reply = handle(_verify(tiny_db, wide, wide, episode=True, max_result_rows=10_000))
    assert reply["value"] == 1.0 and ran == [wide, wide, wide]  # query, gold, answer again
    small = "SELECT i FROM range(2000) t(i)"
    handle(_query(tiny_db, small, count_limit=10_000))
    handle(_verify(tiny_db, small, small, episode=True, max_result_rows=10_000))
    assert ran[3:] == [small, small]  # query, gold; the answer was the kept result


def test_digests_are_equal_only_for_results_that_match():
    """Equal digests mean results_match is true (ordered: as lists; multiset: as
    multisets); values without an exact literal form have no digest."""
    from vt_envs.domains.sql.results import ResultRows

    def digest(rows, order_matters=False):
        return ResultRows(rows).digest(order_matters)

    rows = [(1, "a", 2.5, None, b"x"), (2, "b'\"\n", -0.5, None, b"")]
    assert digest(rows) == digest(rows[::-1]) and digest(rows, True) != digest(rows[::-1], True)
    assert results_match(rows, rows[::-1]) and digest(rows, True) == digest(list(rows), True)
    assert digest([(decimal.Decimal("1.5"), datetime.date(2020, 1, 2))]) == digest(
        [(1.5, "2020-01-02")]
    )  # equal after normalization, as results_match sees them
    assert digest([(True,)]) == digest([(1,)])
    # Different values, even ones results_match accepts, never share a digest.
    for a, b in [([(1,)], [(1.0,)]), ([("1",)], [(1,)]), ([(1, 2)], [(12,)]), ([("a\nb",)],
                 [("a",), ("b",)]), ([], [()]), ([(None,)], [("None",)])]:  # fmt: skip
        assert digest(a) != digest(b), (a, b)
    assert digest([(float("nan"),)]) == digest([("NaN",)])  # NaN normalizes to "NaN"
    assert ResultRows([(object(),)]).digests() is None


ORDERED = "SELECT * FROM (VALUES (1), (2)) t(x) ORDER BY x"
# (gold, answer SQL, reward): the worker's verdicts, which the host's fast path must repeat.
FAST_CASES = [
    ("SELECT 1 AS x UNION ALL SELECT 2", "SELECT 1 AS x UNION ALL SELECT 2", 1.0),
    ("SELECT * FROM (VALUES (1), (2)) t(x)", "SELECT * FROM (VALUES (2), (1)) t(x)", 1.0),
    # Order-sensitive gold: the same multiset in another order scores 0.
    (ORDERED, "SELECT * FROM (VALUES (2), (1)) t(x)", 0.0),
    (ORDERED, "SELECT * FROM (VALUES (1), (2)) t(x)", 1.0),
    ("SELECT 1.0 / 3 AS x", "SELECT 0.3333333334 AS x", 1.0),  # tolerance: the worker decides
    ("SELECT 1 AS x", "SELECT 1.0::DOUBLE AS x", 1.0),  # int vs float: the worker decides
    ("SELECT 1 AS x", "SELECT 2 AS x", 0.0),
]


def _episodes(db_path, cases, rounds=2):
    """Play each case ``rounds`` times (query, then answer the same SQL); the rewards
    and verifier parts, and how many verifications the host decided alone."""
    env = gym.make("VT-SQL-v0", split="test")
    verifier = env.unwrapped.verifier
    real, fast = verifier._known_match, []
    verifier._known_match = lambda *a: fast.append(real(*a)) or fast[-1]
    out = []
    try:
        for _ in range(rounds):
            for i, (gold, sql, _) in enumerate(cases):
                task = Task(f"fast/{i}", "q", gold=gold, assets={"db_path": str(db_path)})
                env.reset(options={"task": task})
                env.step(f"<sql>{sql}</sql>")
                _, reward, terminated, _, info = env.step(f"<answer>{sql}</answer>")
                assert terminated
                out.append((reward, info.get("verifier_parts")))
    finally:
        env.close()
    return out, fast


def test_the_host_grades_a_known_match_as_the_worker_would(db_paths, monkeypatch):
    from vt_envs.domains.sql.verifier import ExecutionMatch

    fast, hits = _episodes(db_paths["shop"], FAST_CASES)
    assert [r for r, _ in fast] == [c[2] for c in FAST_CASES] * 2
    # Decided on the host: the exact matches once the worker reported their gold's
    # digest (the fourth case's gold is the third's).
    first, second = [False, False, False, True], [True, True, False, True]
    assert hits == [*first, False, False, False, *second, False, False, False]
    monkeypatch.setattr(ExecutionMatch, "_known_match", lambda *a: False)
    slow, hits = _episodes(db_paths["shop"], FAST_CASES)
    assert slow == fast and not any(hits)


def test_the_host_trusts_a_gold_digest_only_from_the_episodes_own_worker(db_paths):
    """A gold digest another worker process reported (one the policy's SQL might have
    taken over) never grades this worker's results: the worker is asked."""
    from vt_envs.domains.sql.results import ResultRows

    env = gym.make("VT-SQL-v0", split="test")
    verifier = env.unwrapped.verifier
    task = Task("fast/0", "q", gold="SELECT 1 AS x", assets={"db_path": str(db_paths["shop"])})
    try:
        env.reset(options={"task": task})
        env.step("<answer>SELECT 1 AS x</answer>")  # the worker reports the gold's digest
        (key, (process, digest)), = verifier._gold_digests.items()  # fmt: skip
        assert process() is not None and digest == ResultRows([(1,)]).digest(False)

        class Other:  # another worker process, alive
            alive = True

        other = Other()
        forged = ResultRows([(2,)]).digest(False)  # what a taken-over worker might claim
        verifier._gold_digests[key] = (weakref.ref(other), forged)
        env.reset(options={"task": task})
        env.step("<sql>SELECT 2 AS x</sql>")
        assert env.step("<answer>SELECT 2 AS x</answer>")[1] == 0.0
        verifier._gold_digests[key] = (process, forged)  # the same process: its word
        env.reset(options={"task": task})
        env.step("<sql>SELECT 2 AS x</sql>")
        assert env.step("<answer>SELECT 2 AS x</answer>")[1] == 1.0
    finally:
        env.close()


@pytest.mark.asyncio
async def test_verifiers_of_many_envs_share_one_pool_of_workers(db_paths):
    """Remote envs verify in the verifier's own workers; twelve envs' verifiers
    verifying at once share the process's pool (at most ``workers`` per database)
    instead of starting a worker each (before: 12 worker process trees)."""
    import asyncio

    import psutil

    from vt_envs.domains.sql.verifier import ExecutionMatch

    me = psutil.Process()
    env = vt_envs.make("VT-SQL-v0", split="test", databases=["shop"])
    task = env.tasks[0]
    env.close()
    before = len(me.children())
    verifiers = [ExecutionMatch(workers=2) for _ in range(12)]
    try:
        scores = await asyncio.gather(*(v.averify(task, task.gold) for v in verifiers))
        assert [s.value for s in scores] == [1.0] * 12
        assert len(me.children()) - before <= 2  # the pool's two workers, no more
    finally:
        await asyncio.gather(*(v.aclose() for v in verifiers))
    assert len(me.children()) == before  # the last verifier to leave stopped them
