"""SQLTool: result rendering, errors as observations, and hostile queries."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from vt_envs.core.task import Task
from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.tools import SQLTool, render_table


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _run(tool: SQLTool, db: Path, *queries: str):
    session = await tool.open_session(Task("t", "q", assets={"db_path": str(db)}))
    try:
        return [await tool.call(session, {"query": q}) for q in queries]
    finally:
        await tool.close_session(session)
        await tool.close_session(session)  # idempotent


@pytest.mark.asyncio
async def test_result_is_a_compact_table(db_paths):
    (result,) = await _run(
        SQLTool(),
        db_paths["shop"],
        "SELECT category, COUNT(*) AS n FROM products GROUP BY 1 ORDER BY 1 LIMIT 2",
    )
    assert result.ok
    assert result.text == "category | n\nBooks | 20\nGames | 15\n(2 rows)"
    assert result.metrics["rows"] == 2 and result.metrics["truncated"] == 0


@pytest.mark.asyncio
async def test_row_and_character_caps_add_a_note(db_paths):
    rows, chars, many = await _run(
        SQLTool(max_rows=50, max_chars=200),
        db_paths["shop"],
        "SELECT range AS i FROM range(120)",
        "SELECT name FROM customers ORDER BY customer_id",
        "SELECT * FROM range(20000)",
    )
    assert rows.text.endswith("(showing 50 of 120 rows)") and rows.metrics["truncated"] == 1
    assert rows.text.count("\n") == 51
    assert chars.text.endswith("of 400 rows)") and len(chars.text) < 260
    assert many.text.endswith("(showing 50 of more than 10000 rows)")


def test_render_table_edge_cases():
    assert render_table(["a"], [], 0) == "a\n(no rows)"
    assert render_table(["a", "b"], [(None, 1.5), ("x|y", 2)], 2) == (
        "a | b\nNULL | 1.5\nx\\|y | 2\n(2 rows)"
    )
    assert render_table(["s"], [("x" * 100,)], 1, max_cell_chars=10) == "s\nxxxxxxx...\n(1 row)"


@pytest.mark.asyncio
async def test_errors_become_observations(db_paths):
    syntax, missing, empty = await _run(
        SQLTool(), db_paths["shop"], "SELEC 1", "SELECT * FROM nope", "  -- nothing"
    )
    assert (syntax.ok, syntax.error) == (False, "syntax_error")
    assert "syntax error" in syntax.text
    assert (missing.ok, missing.error) == (False, "catalog_error")
    assert "nope" in missing.text
    assert (empty.ok, empty.error) == (False, "empty")


HOSTILE = {
    "copy": ("COPY orders TO '{tmp}/out.csv'", "not_read_only"),
    "copy_subquery": ("COPY (SELECT 1) TO '{tmp}/out.csv'", "not_read_only"),
    "export": ("EXPORT DATABASE '{tmp}/export'", "not_read_only"),
    "attach": ("ATTACH '{tmp}/other.duckdb' AS other", "not_read_only"),
    "install": ("INSTALL httpfs", "not_read_only"),
    "load": ("LOAD httpfs", "not_read_only"),
    "read_csv": ("SELECT * FROM read_csv('/etc/passwd')", "permission_denied"),
    "read_text": ("SELECT * FROM read_text('/etc/hostname')", "permission_denied"),
    "glob": ("SELECT * FROM glob('/etc/*')", "permission_denied"),
    "set": ("SET enable_external_access = true", "not_read_only"),
    "set_threads": ("SET threads = 1", "not_read_only"),
    "pragma_set": ("PRAGMA threads = 1", "not_read_only"),
    "drop": ("DROP TABLE orders", "not_read_only"),
    "delete": ("DELETE FROM orders", "not_read_only"),
    "update": ("UPDATE orders SET status = 'x'", "not_read_only"),
    "create": ("CREATE TABLE t AS SELECT 1", "not_read_only"),
    "create_temp": ("CREATE TEMP TABLE t AS SELECT 1", "not_read_only"),
    "multiple": ("SELECT 1; DROP TABLE orders", "multiple_statements"),
    "multiple_selects": ("SELECT 1; SELECT 2", "multiple_statements"),
    "checkpoint": ("CHECKPOINT", "not_read_only"),
}


@pytest.mark.asyncio
async def test_hostile_queries_fail_cleanly_and_touch_nothing(db_paths, tmp_path):
    db = db_paths["shop"]
    before = _digest(db)
    queries = [sql.format(tmp=tmp_path) for sql, _ in HOSTILE.values()]
    results = await _run(SQLTool(), db, *queries, "SELECT COUNT(*) FROM orders")
    for (name, (_, kind)), result in zip(HOSTILE.items(), results):
        assert (name, result.ok, result.error) == (name, False, kind)
        assert result.text.startswith("Error")
    assert results[-1].ok and "3000" in results[-1].text
    assert list(tmp_path.iterdir()) == []
    assert _digest(db) == before


def test_connection_itself_refuses_hostile_statements(db_paths, tmp_path):
    """Defence in depth: the engine refuses even without the statement filter."""
    import duckdb

    con = connect_readonly(db_paths["shop"])
    try:
        for sql, _ in HOSTILE.values():
            if sql.startswith(("SELECT 1;", "CREATE TEMP", "CHECKPOINT")):
                continue  # harmless at the engine level; the filter rejects them
            with pytest.raises(duckdb.Error):
                con.execute(sql.format(tmp=tmp_path))
    finally:
        con.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.asyncio
async def test_exploding_cross_join_times_out_and_the_session_still_works(db_paths):
    tool = SQLTool(timeout_s=0.3)
    explode, after = await _run(
        tool,
        db_paths["flights"],
        "SELECT COUNT(*) FROM flights a, flights b, flights c WHERE a.dep_time + b.dep_time "
        "> c.dep_time",
        "SELECT COUNT(*) FROM airlines",
    )
    assert (explode.ok, explode.error) == (False, "timeout")
    assert "timeout" in explode.text
    assert after.ok and "16" in after.text


@pytest.mark.asyncio
async def test_cancelled_call_interrupts_the_query(db_paths):
    tool = SQLTool(timeout_s=30)
    session = await tool.open_session(Task("t", "q", assets={"db_path": str(db_paths["flights"])}))
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                tool.call(session, {"query": "SELECT COUNT(*) FROM flights a, flights b"}), 0.3
            )
        result = await asyncio.wait_for(
            tool.call(session, {"query": "SELECT 7"}), 10
        )  # returns promptly only if the cross join was interrupted
        assert result.ok and "7" in result.text
    finally:
        await tool.close_session(session)


def test_config_errors():
    from vt_envs.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="max_rows"):
        SQLTool(max_rows=0)


def test_one_env_keeps_one_worker_across_databases(db_paths):
    """Episodes of one VT-SQL-v0 env on tasks of all three databases, in turn: its
    worker comes to bind every database, so the env holds one worker process, not
    one per database (before: a kept worker per database, 3x the memory an env)."""
    import psutil

    import vt_envs

    me = psutil.Process()
    env = vt_envs.make("VT-SQL-v0", split="test")
    tasks = [env.tasks[i] for i in range(9)]  # three of each database, interleaved
    assert len({t.assets["db_id"] for t in tasks}) == 3
    oracle = vt_envs.oracle_for("VT-SQL-v0")
    alive = []
    try:
        for task in tasks:
            result = vt_envs.run_episode(env, oracle, options={"task": task})
            assert result.reward == 1.0, result.observations
            alive.append(len(me.children(recursive=True)))
    finally:
        env.close()
    # Widening starts at most one process tree per new database; then none.
    assert alive[-1] == alive[0], alive
    assert alive[3:] == [alive[0]] * 6, alive


@pytest.mark.asyncio
async def test_a_widening_pool_reuses_a_worker_that_holds_the_binds(db_paths):
    from vt_envs.domains.sql.tools import SQL_POLICY, sql_binds
    from vt_envs.sandbox.service import ServicePool, service_spec
    from vt_envs.tools._sandboxed import resolve

    isolation = resolve(SQL_POLICY, None)
    binds = [sql_binds(str(db_paths[name]), isolation)[0] for name in ("shop", "tpch")]
    pool = ServicePool(isolation, service_spec("vt_envs.domains.sql.worker"), widen_binds=2)
    first = await pool.acquire(binds[0])
    await pool.release(first)
    wider = await pool.acquire(binds[1])  # replaces the idle one, binding both
    assert wider is not first and first.closed
    assert wider.binds == {**binds[0], **binds[1]}
    await pool.release(wider)
    assert await pool.acquire(binds[0]) is wider  # a superset serves either database
    await pool.release(wider)
    third = {"/tmp/db/other.duckdb": str(db_paths["flights"])}
    narrow = await pool.acquire(third)  # past widen_binds: only what was asked for
    assert narrow.binds == third and wider.closed
    await pool.release(narrow)
    await pool.aclose()


@pytest.mark.asyncio
async def test_workers_started_together_queue_for_start_slots(db_paths, monkeypatch):
    """Hundreds of envs' SQL workers starting at one reset wave each took CPU from the
    others until every ready deadline passed (512 on 2 CPUs); a loop now starts at most
    start_slots() services at a time, the rest queue, and all of them come up."""
    from vt_envs.sandbox import service
    from vt_envs.sandbox.process import SandboxProcess

    monkeypatch.setattr(service, "start_slots", lambda: 2)
    inner, starting, most = SandboxProcess.start, 0, 0

    async def counted(*args, **kwargs):
        nonlocal starting, most
        starting += 1
        most = max(most, starting)
        try:
            return await inner(*args, **kwargs)
        finally:
            starting -= 1

    monkeypatch.setattr(SandboxProcess, "start", counted)
    tools = [SQLTool() for _ in range(6)]
    task = Task(id="t", prompt="", gold="", assets={"db_path": str(db_paths["shop"])})
    sessions = []
    try:
        sessions = await asyncio.gather(*(t.open_session(task) for t in tools))
        results = await asyncio.gather(
            *(t.call(s, {"query": "SELECT 7"}) for t, s in zip(tools, sessions))
        )
        assert all(r.ok and "7" in r.text for r in results), [r.text for r in results]
        assert most == 2
    finally:
        for t, s in zip(tools, sessions):
            await t.close_session(s)
        for t in tools:
            await t.aclose()
