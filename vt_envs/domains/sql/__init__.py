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

from vt_envs.domains.sql.config import INSTRUCTIONS, SQL, SQLConfig
from vt_envs.domains.sql.databases import EMBEDDED_DATABASES, connect_readonly, database_path
from vt_envs.domains.sql.oracle import SQLOracle
from vt_envs.domains.sql.spider import load_spider
from vt_envs.domains.sql.tasks import sql_tasks
from vt_envs.domains.sql.tools import SQLTool
from vt_envs.domains.sql.verifier import ExecutionMatch, results_match
from vt_envs.tools.builder import domain_builder

__all__ = [
    "EMBEDDED_DATABASES",
    "INSTRUCTIONS",
    "SQL",
    "ExecutionMatch",
    "SQLConfig",
    "SQLOracle",
    "SQLTool",
    "connect_readonly",
    "database_path",
    "load_spider",
    "make_sql_env",
    "results_match",
    "sql_tasks",
]

make_sql_env = domain_builder(SQL, name="make_sql_env", module=__name__)
