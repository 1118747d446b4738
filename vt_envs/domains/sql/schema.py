"""Describing a database to the agent: tables, columns, types, keys and sample rows.

The schema is rendered as ``CREATE TABLE`` statements (the form text-to-SQL
models are trained on) followed by a few sample rows as comments. Keys come
from the caller (embedded databases document theirs; Spider/BIRD databases
take them from ``tables.json`` or the SQLite file), because the databases do
not enforce them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import duckdb

from vt_envs.domains.sql.results import format_value

__all__ = ["format_value", "quote_identifier", "render_schema"]


def quote_identifier(name: str) -> str:
    """``name`` as a DuckDB identifier, quoted only when it needs to be."""
    if name.isidentifier() and name.lower() == name and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


def render_schema(
    con: duckdb.DuckDBPyConnection,
    *,
    keys: Mapping[str, Mapping[str, Sequence]] | None = None,
    sample_rows: int = 3,
    max_value_chars: int = 40,
) -> str:
    """Render every table of ``con``'s main database, in name order.

    Args:
        keys: ``{table: {"primary_key": [...], "foreign_keys": [(col,
            ref_table, ref_col), ...]}}``.
        sample_rows: rows shown per table (0 for none); the first rows in
            storage order, which is deterministic for a given file.
        max_value_chars: long sample values are cut to this length.
    """
    keys = keys or {}
    tables = [
        row[0]
        for row in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = 'main' ORDER BY table_name"
        ).fetchall()
    ]
    blocks = []
    for table in tables:
        columns = con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = "
            "current_database() AND schema_name = 'main' AND table_name = ? ORDER BY column_index",
            [table],
        ).fetchall()
        lines = [f"  {quote_identifier(name)} {dtype}" for name, dtype in columns]
        table_keys = keys.get(table, {})
        if table_keys.get("primary_key"):
            cols = ", ".join(quote_identifier(c) for c in table_keys["primary_key"])
            lines.append(f"  PRIMARY KEY ({cols})")
        for column, ref_table, ref_column in table_keys.get("foreign_keys", ()):
            lines.append(
                f"  FOREIGN KEY ({quote_identifier(column)}) REFERENCES "
                f"{quote_identifier(ref_table)}({quote_identifier(ref_column)})"
            )
        count = con.execute(f"SELECT count(*) FROM {quote_identifier(table)}").fetchone()[0]
        block = f"CREATE TABLE {quote_identifier(table)} (\n" + ",\n".join(lines) + "\n);"
        block += f"\n-- {count} rows"
        if sample_rows > 0 and count:
            rows = con.execute(
                f"SELECT * FROM {quote_identifier(table)} LIMIT {int(sample_rows)}"
            ).fetchall()
            header = " | ".join(name for name, _ in columns)
            body = [" | ".join(format_value(v, max_value_chars) for v in row) for row in rows]
            block += f"; sample rows:\n-- {header}\n" + "\n".join(f"-- {line}" for line in body)
        blocks.append(block)
    return "\n\n".join(blocks)
