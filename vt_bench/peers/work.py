"""The inputs both sides of a comparison get, written once into a work directory.

- ``sql``: VT's embedded ``shop`` database exported to SQLite in Spider's layout
  (``spider/database/shop/shop.sqlite``) with three query sets as Spider question files:
  ``simple`` (a count over one table), ``select_star`` (1,000 rows of one table)
  and ``join`` (revenue by city over four tables). VT reads the SQLite file
  through its Spider loader (a DuckDB copy); SkyRL-gym's text2sql reads it as is.
- ``math_pairs``: final answers and golds in the forms graders meet (integers,
  fractions, LaTeX fractions, decimals, roots, expressions), right and wrong.
- ``math_problems``: VT-Math-v0 held-out questions with their golds.
- ``python_codes``: short programs for one Python tool call each.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["MATH_PAIRS", "PYTHON_CODES", "SQL_QUERIES", "math_problems", "write_sql"]

SQL_QUERIES: dict[str, list[str]] = {
    "simple": [f"SELECT COUNT(*) FROM orders WHERE customer_id = {i}" for i in range(1, 41)],
    "select_star": [
        f"SELECT * FROM order_items ORDER BY order_id, product_id LIMIT 1000 OFFSET {k * 1000}"
        for k in range(5)
    ],
    "join": [
        "SELECT c.city, SUM(oi.quantity * oi.unit_price) AS revenue, COUNT(DISTINCT o.order_id) "
        "AS orders FROM customers c JOIN orders o ON o.customer_id = c.customer_id "
        "JOIN order_items oi ON oi.order_id = o.order_id JOIN products p ON p.product_id = "
        f"oi.product_id WHERE p.category <> '{category}' GROUP BY c.city ORDER BY revenue DESC"
        for category in ("Books", "Games", "Garden", "Kitchen", "Office")
    ],
}

MATH_PAIRS: list[tuple[str, str]] = [
    ("\\boxed{42}", "42"),
    ("\\boxed{41}", "42"),
    ("\\boxed{3/4}", "\\frac{3}{4}"),
    ("\\boxed{0.75}", "\\frac{3}{4}"),
    ("\\boxed{\\frac{6}{8}}", "0.75"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{-7}", "-7"),
    ("\\boxed{\\pi}", "3.14159"),
    ("\\boxed{12.5}", "25/2"),
    ("\\boxed{13}", "12"),
]

PYTHON_CODES: list[str] = [
    "print(sum(range(1000)))",
    "import math\nprint(math.factorial(20))",
    "xs = [i * i for i in range(2000)]\nprint(len(xs), xs[-1])",
    "print('hello')",
]


def write_sql(root: Path) -> dict[str, Any]:
    """Export ``shop`` to ``root/database/shop/shop.sqlite``; write one Spider question
    file per query set; returns the paths."""
    import duckdb

    from vt_envs.domains.sql.databases import database_path

    target = root / "spider" / "database" / "shop" / "shop.sqlite"  # SkyRL-gym's layout
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    source = duckdb.connect(str(database_path("shop")), read_only=True)
    sink = sqlite3.connect(target)
    try:
        for (table,) in source.execute("SHOW TABLES").fetchall():
            columns = source.execute(f"DESCRIBE {table}").fetchall()
            types = {"INTEGER": "INTEGER", "VARCHAR": "TEXT", "DATE": "TEXT"}
            declared = ", ".join(f"{c[0]} {types.get(c[1], 'REAL')}" for c in columns)
            sink.execute(f"CREATE TABLE {table} ({declared})")
            rows = source.execute(f"SELECT * FROM {table}").fetchall()
            marks = ", ".join("?" * len(columns))
            sink.executemany(f"INSERT INTO {table} VALUES ({marks})", [_plain(r) for r in rows])
        sink.commit()
    finally:
        sink.close()
        source.close()
    files = {}
    for kind, queries in SQL_QUERIES.items():
        path = root / f"questions_{kind}.json"
        records = [{"db_id": "shop", "question": f"Query {i}", "query": q}
                   for i, q in enumerate(queries)]  # fmt: skip
        path.write_text(json.dumps(records))
        files[kind] = str(path)
    return {"database_dir": str(target.parent.parent), "db_root": str(root), "questions": files}


def _plain(row: tuple) -> tuple:
    return tuple(v if isinstance(v, (int, float, str)) or v is None else _scalar(v) for v in row)


def _scalar(value: Any) -> Any:
    from decimal import Decimal

    return float(value) if isinstance(value, Decimal) else str(value)


def math_problems(count: int) -> list[dict[str, str]]:
    """``count`` VT-Math-v0 held-out questions: ``{"id", "question", "answer"}``."""
    import vt_envs

    env = vt_envs.make("VT-Math-v0", split="test")
    try:
        tasks = [env.tasks[i] for i in range(min(count, len(env.tasks)))]
    finally:
        env.close()
    return [{"id": t.id, "question": t.prompt, "answer": str(t.gold)} for t in tasks]
