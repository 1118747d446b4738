"""The question templates of the embedded databases, one module per database.

:data:`POOLS` maps a database to the queries whose rows its templates draw
parameters from; :data:`TEMPLATES` maps it to its templates in draw order.
:mod:`vt_envs.domains.sql.questions` draws and checks the questions.
"""

from __future__ import annotations

from vt_envs.domains.sql.templates import flights, shop, tpch
from vt_envs.domains.sql.templates.base import DIFFICULTIES, Template, sql_str

__all__ = ["DIFFICULTIES", "POOLS", "TEMPLATES", "Template", "sql_str"]

# Pools: values templates draw from, read once per database in a fixed order.
POOLS: dict[str, dict[str, str]] = {
    "flights": flights.POOLS,
    "tpch": tpch.POOLS,
    "shop": shop.POOLS,
}

TEMPLATES: dict[str, list[Template]] = {
    "flights": flights.templates(),
    "tpch": tpch.templates(),
    "shop": shop.templates(),
}
