"""VT-SQL-v0: text-to-SQL on DuckDB, rewarded by execution match.

The prompt gives a database's schema (tables, columns, types, keys, sample
rows) and a question. The agent explores with ``<sql>QUERY</sql>`` (the
read-only :class:`SQLTool`) and answers ``<answer>SQL</answer>``; the reward
is 1.0 when its SQL returns the gold SQL's result (:class:`ExecutionMatch`).

Tasks come from the embedded databases (built at first use, no download;
see :mod:`~vt_envs.domains.sql.databases`) or from Spider/BIRD files the
user has (``spider_files=...``; see :mod:`~vt_envs.domains.sql.spider`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vt_envs.core.env import ToolEnv
from vt_envs.domains.sql.databases import EMBEDDED_DATABASES, connect_readonly, database_path
from vt_envs.domains.sql.examples import EXAMPLES
from vt_envs.domains.sql.oracle import SQLOracle
from vt_envs.domains.sql.spider import load_spider
from vt_envs.domains.sql.tasks import sql_tasks
from vt_envs.domains.sql.tool import SQLTool
from vt_envs.domains.sql.verifier import ExecutionMatch, results_match
from vt_envs.tools.builder import env_builder

__all__ = [
    "EMBEDDED_DATABASES",
    "INSTRUCTIONS",
    "ExecutionMatch",
    "SQLOracle",
    "SQLTool",
    "connect_readonly",
    "database_path",
    "load_spider",
    "make_sql_env",
    "results_match",
    "sql_tasks",
]

INSTRUCTIONS = (
    "You answer questions about a DuckDB database by writing SQL. You may explore the "
    "database with the sql tool first. Your final answer is one SQL query (DuckDB dialect) "
    "whose result answers the question: it is executed and its result is compared with the "
    "reference result, so return exactly the columns the question asks for, in that order."
)


@env_builder
def make_sql_env(
    *,
    split: str = "train",
    databases: Sequence[str] = ("flights", "tpch", "shop"),
    size_per_database: int | None = None,
    spider_files: dict[str, str] | None = None,
    schema_sample_rows: int = 3,
    query_timeout_s: float = 5.0,
    max_result_rows: int = 50,
    max_result_chars: int = 9000,
    column_order_insensitive: bool = False,
    max_turns: int = 5,
    remind_turns_left: bool = True,
    max_episode_tokens: int = 16384,
    max_observation_tokens: int = 4096,
    examples: Any = None,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build VT-SQL-v0.

    Args:
        split: ``"train"`` or ``"test"`` (the fixed held-out questions).
        databases: embedded databases to draw from (``flights``, ``tpch``, ``shop``).
        size_per_database: questions per database (default 10,000 train, 100 test).
        spider_files: run on Spider/BIRD files instead:
            ``{"questions": "dev.json", "database_dir": "database/",
            "tables": "tables.json"}`` (``tables`` optional).
        schema_sample_rows: sample rows shown per table in the prompt.
        query_timeout_s: time limit of each query (tool and verifier).
        max_result_rows, max_result_chars: caps of a rendered result.
        column_order_insensitive: accept answers with the right columns in another order.
        examples: worked examples before the task; ``None``: the two of
            :mod:`vt_envs.domains.sql.examples` (on a database of their own);
            ``[]``: none.
        max_turns, remind_turns_left, max_episode_tokens, max_observation_tokens,
        **env_kwargs: passed to :class:`ToolEnv`.
    """
    if spider_files is not None:
        files = dict(spider_files)
        tasks = load_spider(
            files.pop("questions"),
            database_dir=files.pop("database_dir"),
            tables_path=files.pop("tables", None),
            split=split,
            schema_sample_rows=schema_sample_rows,
            **files,
        )
    else:
        tasks = sql_tasks(
            split,
            databases=databases,
            size_per_database=size_per_database,
            schema_sample_rows=schema_sample_rows,
        )
    return ToolEnv(
        tools=[
            SQLTool(timeout_s=query_timeout_s, max_rows=max_result_rows, max_chars=max_result_chars)
        ],
        tasks=tasks,
        verifier=ExecutionMatch(
            timeout_s=2 * query_timeout_s, column_order_insensitive=column_order_insensitive
        ),
        instructions=INSTRUCTIONS,
        max_turns=max_turns,
        remind_turns_left=remind_turns_left,
        max_episode_tokens=max_episode_tokens,
        max_observation_tokens=max_observation_tokens,
        examples=EXAMPLES if examples is None else examples,
        name="VT-SQL-v0",
        **env_kwargs,
    )
