"""Spider / BIRD files → VT-SQL tasks on DuckDB copies of their SQLite databases.

The files users bring:

- questions: a JSON (or JSONL) list of records with ``question``, ``db_id``
  and the gold SQL under ``query`` (Spider) or ``SQL`` (BIRD); BIRD's
  ``evidence`` is shown as a hint under the question;
- ``database/<db_id>/<db_id>.sqlite``: one SQLite file per database;
- ``tables.json`` (optional): the schemas; used for primary and foreign keys
  (otherwise they are read from the SQLite files).

Each SQLite database is converted to DuckDB *without DuckDB extensions*
(which cannot be downloaded here): Python's ``sqlite3`` reads every table and
DuckDB receives the rows through a column scan. SQLite is dynamically typed,
so each column's DuckDB type follows the values it really holds (a column
declared ``INT`` that holds some text becomes ``VARCHAR``). Conversions are
cached next to the embedded databases, keyed by the SQLite file's path, size,
modification time and this module's source.

Gold queries are written for SQLite. Backquoted identifiers (BIRD) are
rewritten to DuckDB's double quotes; other dialect gaps remain, so each gold
is executed once at load and failing ones are dropped (default), kept, or
raised, with a warning that counts them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb

from vt_envs.core.loaders import read_records
from vt_envs.core.task import Task, TaskList
from vt_envs.domains.sql.databases import build_atomically, cache_dir, connect_readonly, insert_rows
from vt_envs.domains.sql.execution import execute_query
from vt_envs.domains.sql.schema import quote_identifier
from vt_envs.domains.sql.tasks import format_prompt, schema_text
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = ["convert_sqlite", "keys_from_tables_json", "load_spider", "sqlite_sql_to_duckdb"]

logger = logging.getLogger(__name__)

GOLD_ERROR_MODES = ("drop", "keep", "raise")
_CHUNK_ROWS = 50_000

Keys = dict[str, dict[str, list]]


def sqlite_sql_to_duckdb(sql: str) -> str:
    """Rewrite SQLite-only quoting for DuckDB: backquoted identifiers become double-quoted.

    String literals are left untouched.
    """
    out, i = [], 0
    for match in re.finditer(r"'(?:[^']|'')*'|`([^`]*)`", sql):
        out.append(sql[i : match.start()])
        if match.group(1) is not None:
            out.append('"' + match.group(1).replace('"', '""') + '"')
        else:
            out.append(match.group(0))
        i = match.end()
    out.append(sql[i:])
    return "".join(out).strip().rstrip(";").strip()


# ------------------------------------------------------------- conversion


def _column_type(declared: str, kinds: set[str]) -> str:
    """The DuckDB type for a SQLite column with ``declared`` type holding ``kinds`` of values."""
    kinds = kinds - {"null"}
    declared = declared.upper()
    if not kinds:  # all NULL: follow the declaration
        if "INT" in declared:
            return "BIGINT"
        if any(t in declared for t in ("REAL", "FLOA", "DOUB", "NUM", "DEC")):
            return "DOUBLE"
        return "VARCHAR"
    if kinds == {"integer"}:
        return "DOUBLE" if any(t in declared for t in ("REAL", "FLOA", "DOUB")) else "BIGINT"
    if kinds <= {"integer", "real"}:
        return "DOUBLE"
    if kinds == {"blob"}:
        return "BLOB"
    return "VARCHAR"


def _to_varchar(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _sqlite_keys(src: sqlite3.Connection, tables: Sequence[str]) -> Keys:
    keys: Keys = {}
    for table in tables:
        info = src.execute(f"PRAGMA table_info({quote_identifier(table)})").fetchall()
        pk = [row[1] for row in sorted(info, key=lambda r: r[5]) if row[5] > 0]
        fks = []
        for row in src.execute(f"PRAGMA foreign_key_list({quote_identifier(table)})").fetchall():
            ref_table, column, ref_column = row[2], row[3], row[4]
            if ref_column is None:  # references the other table's primary key
                ref_info = src.execute(f"PRAGMA table_info({quote_identifier(ref_table)})")
                ref_pk = [r[1] for r in ref_info.fetchall() if r[5] > 0]
                ref_column = ref_pk[0] if ref_pk else column
            fks.append([column, ref_table, ref_column])
        entry: dict[str, list] = {}
        if pk:
            entry["primary_key"] = pk
        if fks:
            entry["foreign_keys"] = fks
        if entry:
            keys[table] = entry
    return keys


def _copy_table(src: sqlite3.Connection, dst: duckdb.DuckDBPyConnection, table: str) -> None:
    quoted = quote_identifier(table)
    info = src.execute(f"PRAGMA table_info({quoted})").fetchall()
    names = [row[1] for row in info]
    types = []
    for row in info:
        column = quote_identifier(row[1])
        kinds = {k for (k,) in src.execute(f"SELECT DISTINCT typeof({column}) FROM {quoted}")}
        types.append(_column_type(row[2] or "", kinds))
    columns = ", ".join(f"{quote_identifier(n)} {t}" for n, t in zip(names, types))
    dst.execute(f"CREATE TABLE {quoted} ({columns})")
    varchar = [t == "VARCHAR" for t in types]
    cursor = src.execute(f"SELECT * FROM {quoted}")
    while chunk := cursor.fetchmany(_CHUNK_ROWS):
        if any(varchar):
            chunk = [
                tuple(_to_varchar(v) if text else v for v, text in zip(row, varchar))
                for row in chunk
            ]
        insert_rows(dst, table, chunk)


def _conversion_key(sqlite_path: Path) -> str:
    stat = sqlite_path.stat()
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(duckdb.__version__.encode())
    digest.update(f"{sqlite_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def convert_sqlite(sqlite_path: str | os.PathLike[str]) -> tuple[Path, Keys]:
    """Convert a SQLite database to a cached DuckDB file; return its path and keys.

    The keys (from the SQLite declarations) are stored beside it as JSON.
    """
    sqlite_path = Path(sqlite_path)
    if not sqlite_path.is_file():
        raise DatasetFormatError(f"SQLite database {str(sqlite_path)!r} does not exist")
    target = cache_dir() / "spider" / f"{sqlite_path.stem}-{_conversion_key(sqlite_path)}.duckdb"
    keys_path = target.with_suffix(".keys.json")

    def build(dst: duckdb.DuckDBPyConnection) -> None:
        src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
        src.text_factory = lambda raw: raw.decode("utf-8", "replace")
        try:
            tables = [
                name
                for (name,) in src.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY name"
                )
            ]
            for table in tables:
                _copy_table(src, dst, table)
            keys_path.write_text(json.dumps(_sqlite_keys(src, tables), sort_keys=True))
        finally:
            src.close()

    build_atomically(target, build)
    keys = json.loads(keys_path.read_text()) if keys_path.exists() else {}
    return target, keys


def keys_from_tables_json(entry: Mapping[str, Any]) -> Keys:
    """Keys of one ``tables.json`` entry (Spider's single-column or BIRD's composite PKs)."""
    tables = entry.get("table_names_original") or entry.get("table_names") or []
    columns = entry.get("column_names_original") or entry.get("column_names") or []
    keys: Keys = {}

    def column(index: int) -> tuple[str, str]:
        table_index, name = columns[index]
        return tables[table_index], name

    for pk in entry.get("primary_keys", []):
        indices = pk if isinstance(pk, list) else [pk]
        for index in indices:
            table, name = column(index)
            keys.setdefault(table, {}).setdefault("primary_key", []).append(name)
    for source, target in entry.get("foreign_keys", []):
        table, name = column(source)
        ref_table, ref_name = column(target)
        fks = keys.setdefault(table, {}).setdefault("foreign_keys", [])
        fks.append([name, ref_table, ref_name])
    return keys


# ---------------------------------------------------------------- loading


def _gold_of(record: Mapping[str, Any], index: int, origin: str) -> str:
    for field in ("query", "SQL", "sql"):
        if isinstance(record.get(field), str):
            return record[field]
    raise DatasetFormatError(
        f"{origin}: record {index} has no gold SQL under 'query' (Spider) or 'SQL' (BIRD); "
        f"it has {sorted(record)}"
    )


def load_spider(
    questions_path: str | os.PathLike[str],
    *,
    database_dir: str | os.PathLike[str],
    tables_path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    split: str = "test",
    limit: int | None = None,
    schema_sample_rows: int = 3,
    use_evidence: bool = True,
    on_gold_error: str = "drop",
    gold_timeout_s: float = 30.0,
) -> TaskList:
    """Load Spider- or BIRD-format questions as VT-SQL tasks.

    Args:
        questions_path: ``dev.json`` / ``train_spider.json`` / BIRD's ``dev.json``.
        database_dir: the folder holding ``<db_id>/<db_id>.sqlite``.
        tables_path: ``tables.json`` (keys shown in the schema); optional.
        name: the source name used in task ids (default: the questions file stem).
        limit: load only the first ``limit`` records.
        use_evidence: append BIRD's ``evidence`` to the question as a hint.
        on_gold_error: what to do with a record whose gold SQL fails on DuckDB
            (a SQLite dialect gap): ``"drop"`` it, ``"keep"`` it (it can
            never score), or ``"raise"``.
        gold_timeout_s: time limit of each gold check.

    Task ids: ``<name>/<question_id or index>`` (``split`` only labels the source).
    """
    if on_gold_error not in GOLD_ERROR_MODES:
        raise InvalidConfigError(
            f"on_gold_error must be one of {GOLD_ERROR_MODES}, got {on_gold_error!r}"
        )
    questions_path, database_dir = Path(questions_path), Path(database_dir)
    name = name or questions_path.stem
    records = read_records(questions_path)
    if limit is not None:
        records = records[:limit]
    table_keys: dict[str, Keys] = {}
    if tables_path is not None:
        table_keys = {
            entry["db_id"]: keys_from_tables_json(entry) for entry in read_records(tables_path)
        }
    databases: dict[str, tuple[str, str]] = {}
    tasks, failures = [], []
    for index, record in enumerate(records):
        missing = [f for f in ("question", "db_id") if f not in record]
        if missing:
            raise DatasetFormatError(
                f"{questions_path}: record {index} has no field(s) {missing}; "
                f"it has {sorted(record)}"
            )
        db_id = str(record["db_id"])
        if db_id not in databases:
            path, sqlite_keys = convert_sqlite(database_dir / db_id / f"{db_id}.sqlite")
            keys = table_keys.get(db_id, sqlite_keys)
            databases[db_id] = (str(path), json.dumps(keys, sort_keys=True))
        db_path, keys_json = databases[db_id]
        gold = sqlite_sql_to_duckdb(_gold_of(record, index, str(questions_path)))
        question = str(record["question"]).strip()
        evidence = str(record.get("evidence") or "").strip()
        if use_evidence and evidence:
            question += f"\nHint: {evidence}"
        if on_gold_error != "keep":
            problem = _gold_problem(db_path, gold, gold_timeout_s)
            if problem:
                if on_gold_error == "raise":
                    raise DatasetFormatError(
                        f"{questions_path}: record {index} ({db_id}): the gold SQL fails on "
                        f"DuckDB ({problem}); pass on_gold_error='drop' to skip such records"
                    )
                failures.append(index)
                continue
        task_key = record.get("question_id", index)
        metadata = {"db_id": db_id, "source": name}
        if "difficulty" in record:
            metadata["difficulty"] = record["difficulty"]
        tasks.append(
            Task(
                id=f"{name}/{task_key}",
                prompt=format_prompt(
                    db_id, "", schema_text(db_path, schema_sample_rows, keys_json), question
                ),
                gold=gold,
                metadata=metadata,
                assets={"db_path": db_path, "db_id": db_id},
            )
        )
    if failures:
        logger.warning(
            "%s: dropped %d of %d records whose gold SQL fails on DuckDB (first: %s)",
            questions_path,
            len(failures),
            len(records),
            failures[:10],
        )
    return TaskList(tasks, name=name, split=split)


def _gold_problem(db_path: str, gold: str, timeout_s: float) -> str | None:
    con = connect_readonly(db_path)
    try:
        outcome = execute_query(con, gold, timeout_s=timeout_s, max_rows=1)
    finally:
        con.close()
    return None if outcome.ok else f"{outcome.error}: {outcome.message.splitlines()[0]}"
