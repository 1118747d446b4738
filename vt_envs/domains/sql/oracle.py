"""SQLOracle: explores one table the gold query uses, then answers the gold SQL."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vt_envs.core.policy import OraclePolicy

__all__ = ["SQLOracle", "first_table"]

_FROM = re.compile(r'\b(?:FROM|JOIN)\s+("(?:[^"]|"")+"|[A-Za-z_][\w$]*)', re.IGNORECASE)


def first_table(sql: str) -> str | None:
    """The first table (or CTE) named after ``FROM``/``JOIN`` in ``sql``, as written."""
    match = _FROM.search(sql)
    return match.group(1) if match else None


class SQLOracle(OraclePolicy):
    """A privileged policy: ``SELECT * FROM <table> LIMIT 3`` on a gold table, then the gold.

    Reaches reward 1.0 on every task whose gold runs on its database, which
    proves the tool, the prompt and the verifier fit together.
    """

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        gold = str(self.task.gold)
        if self.turn == 0:
            table = first_table(gold)
            return f"<sql>SELECT * FROM {table} LIMIT 3</sql>" if table else "<sql>SELECT 1</sql>"
        return f"<answer>{gold}</answer>"
