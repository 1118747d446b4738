"""VT-SQL-v0 declared: its keywords (:class:`SQLConfig`) and how its parts are built."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vt_envs.core.domain import Domain
from vt_envs.core.task import TaskSource
from vt_envs.domains.sql.databases import database_path
from vt_envs.domains.sql.examples import EXAMPLES
from vt_envs.domains.sql.spider import load_spider
from vt_envs.domains.sql.tasks import sql_tasks
from vt_envs.domains.sql.tools import SQLTool
from vt_envs.domains.sql.verifier import ExecutionMatch

__all__ = ["INSTRUCTIONS", "SQL", "SQLConfig"]

INSTRUCTIONS = (
    "You answer questions about a DuckDB database by writing SQL. You may explore the "
    "database with the sql tool first. Your final answer is one SQL query (DuckDB dialect) "
    "whose result answers the question: it is executed and its result is compared with the "
    "reference result, so return exactly the columns the question asks for, in that order."
)


@dataclass(frozen=True)
class SQLConfig:
    """VT-SQL-v0's own keywords.

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
    """

    split: str = "train"
    databases: Sequence[str] = ("flights", "tpch", "shop")
    size_per_database: int | None = None
    spider_files: dict[str, str] | None = None
    schema_sample_rows: int = 3
    query_timeout_s: float = 5.0
    max_result_rows: int = 50
    max_result_chars: int = 9000
    column_order_insensitive: bool = False
    examples: Any = None


def tools(config: SQLConfig) -> list[SQLTool]:
    """The read-only ``sql`` tool; its workers bind the embedded databases the tasks
    use from the start (a user's Spider/BIRD databases are bound as tasks need them)."""
    embedded = () if config.spider_files is not None else config.databases
    return [
        SQLTool(
            timeout_s=config.query_timeout_s,
            max_rows=config.max_result_rows,
            max_chars=config.max_result_chars,
            databases=[database_path(name) for name in embedded],
        )
    ]


def tasks(config: SQLConfig) -> TaskSource:
    """The embedded databases' questions, or the user's Spider/BIRD files."""
    if config.spider_files is None:
        return sql_tasks(
            config.split,
            databases=config.databases,
            size_per_database=config.size_per_database,
            schema_sample_rows=config.schema_sample_rows,
        )
    files = dict(config.spider_files)
    return load_spider(
        files.pop("questions"),
        database_dir=files.pop("database_dir"),
        tables_path=files.pop("tables", None),
        split=config.split,
        schema_sample_rows=config.schema_sample_rows,
        **files,
    )


def verifier(config: SQLConfig) -> ExecutionMatch:
    """Execution match, with twice a query's time (the gold and the answer run)."""
    return ExecutionMatch(
        timeout_s=2 * config.query_timeout_s,
        column_order_insensitive=config.column_order_insensitive,
    )


def env_kwargs(config: SQLConfig) -> dict[str, Any]:
    """The worked examples (the SQL ones unless the user gives others)."""
    return {"examples": EXAMPLES if config.examples is None else config.examples}


SQL: Domain[SQLConfig] = Domain(
    id="VT-SQL-v0",
    config=SQLConfig,
    tools=tools,
    tasks=tasks,
    verifier=verifier,
    instructions=INSTRUCTIONS,
    episode={
        "max_turns": 5,
        "remind_turns_left": True,
        "max_episode_tokens": 16384,
        "max_observation_tokens": 4096,
    },
    env_kwargs=env_kwargs,
)
