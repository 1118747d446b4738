"""VT-SQL-v0 against hostile SQL: the host stays bounded and the episode stays responsive.

Every query the model writes runs in a sandboxed SQL worker, so nothing here
may grow the host process or stall it: exponential plans that ignore DuckDB's
interrupt, huge literals and results, statements that walk around the
allow-list through EXPLAIN ANALYZE or PRAGMA, and the same text given as the
final answer (which the verifier runs).
"""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import vt_envs  # noqa: F401  (registers the ids)
from vt_envs.domains.sql import databases
from vt_envs.domains.sql.execution import check_statement, connect_readonly

QUERY_TIMEOUT_S = 1.0
# An exponential plan: every CTE joins the previous one with itself and is
# inlined, so the optimizer's work doubles per level and ignores interrupts.
EXPONENTIAL = (
    "WITH a0 AS NOT MATERIALIZED (SELECT * FROM airlines)"
    + "".join(
        f", a{i} AS NOT MATERIALIZED (SELECT x.* FROM a{i - 1} x, a{i - 1} y "
        "WHERE x.carrier = y.carrier)"
        for i in range(1, 24)
    )
    + " SELECT count(*) FROM a23"
)
HOSTILE = {
    "exponential_plan": EXPONENTIAL,
    "huge_literal": "SELECT length(repeat('x', 2000000000))",
    "huge_result_value": "SELECT repeat('y', 300000000) AS big",
    "huge_result_rows": "SELECT * FROM range(1000000000)",
    "cross_join": "SELECT count(*) FROM flights a, flights b, flights c",
}
REFUSED = {
    "explain_analyze_create": "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT * FROM flights",
    "explain_analyze_macro": "EXPLAIN ANALYZE CREATE TEMP MACRO m() AS 1",
    "explain_prepare": "EXPLAIN ANALYZE PREPARE p AS SELECT 1",
    "explain_checkpoint": "EXPLAIN ANALYZE CHECKPOINT",
    "explain_begin": "EXPLAIN /* hidden */ ANALYZE BEGIN TRANSACTION",
    "import_database": "IMPORT DATABASE '/tmp'",
    "pragma_not_informational": "PRAGMA enable_profiling",
    "set": "SET threads = 8",
    "call": "CALL pragma_version()",
    "temp_table": "CREATE TEMP TABLE t AS SELECT 1",
}
ALLOWED = [
    "EXPLAIN ANALYZE SELECT count(*) FROM airlines",
    "explain select 1",
    "PRAGMA table_info('airlines')",
    "DESCRIBE airlines",
    "SHOW TABLES",
    "SUMMARIZE airlines",
    "FROM airlines LIMIT 1",
    "WITH c AS (SELECT 1 AS x) SELECT * FROM c",
]


def _peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set size


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def sql_env(sql_cache):
    env = gym.make("VT-SQL-v0", split="test", query_timeout_s=QUERY_TIMEOUT_S)
    yield env
    env.close()


def _flights_task(env) -> None:
    tasks = env.unwrapped.tasks
    task_id = next(i for i in tasks.ids() if "/flights/" in i)
    env.reset(options={"task_id": task_id})


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_queries_leave_the_host_bounded_and_the_episode_responsive(sql_env, name):
    _flights_task(sql_env)
    baseline = _rss_mb()
    _peak_rss_reset()
    start = time.monotonic()
    _, _, _, _, info = sql_env.step(f"<sql>{HOSTILE[name]}</sql>")
    took = time.monotonic() - start
    assert took < QUERY_TIMEOUT_S + 2.0, f"the step took {took:.1f} s"
    if name != "huge_result_rows":  # that one is fine: it streams 50 rows and counts
        assert not info["tool"]["ok"], info["message"]
    start = time.monotonic()
    _, _, _, _, info = sql_env.step("<sql>SELECT count(*) FROM airlines</sql>")
    assert time.monotonic() - start < QUERY_TIMEOUT_S + 2.0  # a fresh worker if needed
    assert info["tool"]["ok"] and "16\n(1 row)" in info["message"]["content"]
    assert _peak_rss_mb() - baseline < 1024, "the host's memory grew"


def test_the_same_text_as_the_final_answer_scores_zero_within_its_deadline(sql_env):
    _flights_task(sql_env)
    baseline = _rss_mb()
    _peak_rss_reset()
    start = time.monotonic()
    _, reward, terminated, _, info = sql_env.step(f"<answer>{EXPONENTIAL}</answer>")
    took = time.monotonic() - start
    assert terminated and reward == 0.0 and info["verifier_parts"]["executed"] == 0.0
    assert took < 2 * 2 * QUERY_TIMEOUT_S + 2.0, f"verification took {took:.1f} s"
    assert _peak_rss_mb() - baseline < 1024


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_statements_that_walk_around_the_filter_are_refused(sql_env, name):
    _flights_task(sql_env)
    _, _, _, _, info = sql_env.step(f"<sql>{REFUSED[name]}</sql>")
    assert info["tool"]["error"] in ("not_read_only", "syntax_error"), info["message"]
    assert "read-only" in info["message"]["content"] or "Error" in info["message"]["content"]


def test_the_allow_list_through_the_parser(sql_cache):
    con = connect_readonly(databases.database_path("flights"))
    try:
        for sql in ALLOWED:
            assert check_statement(con, sql) == sql, sql
        for name, sql in REFUSED.items():
            outcome = check_statement(con, sql)
            assert not isinstance(outcome, str) and outcome.error == "not_read_only", name
    finally:
        con.close()


def test_an_episodes_temporary_state_dies_with_it(tmp_path):
    import duckdb

    from vt_envs.domains.sql import worker

    db = str(tmp_path / "own.duckdb")  # its own file: DuckDB wants one config per file
    duckdb.connect(db).close()
    handle = worker.serve({})
    query = {
        "op": "query",
        "db": db,
        "timeout_s": 5,
        "max_rows": 5,
        "max_chars": 900,
        "max_cell_chars": 60,
        "count_limit": 100,
    }
    # (SQL cannot create temporary objects any more; trusted code plants one here)
    handle.episode_connection(db).execute("CREATE TEMP TABLE leftover AS SELECT 42 AS x")
    assert handle({**query, "sql": "SELECT x FROM leftover"})["text"] == "x\n42\n(1 row)"
    handle({"op": "reset"})  # the next episode
    reply = handle({**query, "sql": "SELECT x FROM leftover"})
    assert reply["error"] == "catalog_error"


def test_workers_are_reused_across_episodes_and_replaced_when_killed(sql_env):
    _flights_task(sql_env)
    first = sql_env.unwrapped._live.sessions["sql"]["worker"]
    pids = first.process.host_pids()
    _flights_task(sql_env)
    assert sql_env.unwrapped._live.sessions["sql"]["worker"].process.host_pids() == pids
    sql_env.step(f"<sql>{EXPONENTIAL}</sql>")  # kills the worker
    _, _, _, _, info = sql_env.step("<sql>SELECT 1 AS one</sql>")
    assert info["tool"]["ok"]
    assert not pids & sql_env.unwrapped._live.sessions["sql"]["worker"].process.host_pids()


def test_an_allowed_statement_is_parsed_once_and_binds_to_each_database(tmp_path, monkeypatch):
    """Allowed SQL texts keep their parsed statement: run again, on any database, they
    are not parsed again and give that database's result; refused texts are kept out."""
    import duckdb

    from vt_envs.domains.sql import execution

    paths = []
    for i, ddl in enumerate(
        ["CREATE TABLE t AS SELECT 1 AS x", "CREATE TABLE t AS SELECT 'b' AS x"]
    ):
        paths.append(str(tmp_path / f"{i}.duckdb"))
        con = duckdb.connect(paths[-1])
        con.execute(ddl)
        con.close()
    parsed = []
    real = execution._checked_statement
    monkeypatch.setattr(
        execution, "_checked_statement", lambda c, s: parsed.append(s) or real(c, s)
    )
    sql, refused = "SELECT x FROM t -- parsed once", "PRAGMA threads=8 -- refused"
    results = []
    for path in paths * 2:
        con = connect_readonly(path)
        results.append(execution.execute_query(con, sql, timeout_s=5).rows)
        assert execution.execute_query(con, refused, timeout_s=5).error == "not_read_only"
        con.close()
    assert results == [((1,),), (("b",),)] * 2
    assert parsed == [sql] + [refused] * 4
