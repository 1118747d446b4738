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

Gold queries are written for SQLite. Each is rewritten for DuckDB by
:func:`~vt_envs.domains.sql.dialect.sqlite_to_duckdb` (``sqlglot`` plus
``LIKE`` → ``ILIKE``, truncating integer division, double-quoted string
literals, bare columns of aggregate queries), then *checked by execution*:
the original runs on the SQLite file and the rewrite on its DuckDB copy, and
the gold is kept only if both give the same non-empty result. Every other
gold is refused with a typed reason (:data:`REFUSAL_REASONS`), counted per
reason in a warning and listed in the returned :class:`SpiderTasks`'
``refused``; ``on_gold_error`` drops them (default), keeps them, or raises.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from vt_envs.core.loaders import read_records
from vt_envs.core.task import Task, TaskList
from vt_envs.domains.sql.databases import build_atomically, cache_dir, connect_readonly, insert_rows
from vt_envs.domains.sql.dialect import TranspileError, sqlite_to_duckdb
from vt_envs.domains.sql.execution import execute_query
from vt_envs.domains.sql.results import has_top_level_order_by, results_match
from vt_envs.domains.sql.schema import quote_identifier
from vt_envs.domains.sql.tasks import format_prompt, schema_text
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = [
    "REFUSAL_REASONS",
    "RefusedGold",
    "SpiderTasks",
    "convert_sqlite",
    "keys_from_tables_json",
    "load_spider",
    "sqlite_sql_to_duckdb",
]

logger = logging.getLogger(__name__)

GOLD_ERROR_MODES = ("drop", "keep", "raise")
#: Why a gold is refused: sqlglot cannot parse it; it fails on SQLite (a broken
#: gold) or its rewrite fails on DuckDB; the two results differ; the result
#: depends on which row a bare column is read from; the result is empty (or all
#: NULL), so any empty query would score 1.0.
REFUSAL_REASONS = (
    "parse_error",
    "sqlite_error",
    "duckdb_error",
    "result_mismatch",
    "ambiguous",
    "empty_result",
)
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


@dataclass(frozen=True)
class RefusedGold:
    """A record whose gold SQL could not be carried to DuckDB with its meaning.

    ``reason`` is one of :data:`REFUSAL_REASONS`; ``detail`` says what differed
    or failed; ``duckdb_sql`` is the rewrite (``""`` when there is none).
    """

    index: int
    db_id: str
    reason: str
    detail: str
    sqlite_sql: str
    duckdb_sql: str


class SpiderTasks(TaskList):
    """The tasks :func:`load_spider` kept, with what it refused and rewrote.

    Attributes:
        refused: every refused gold, in record order (kept as tasks too when
            ``on_gold_error="keep"``).
        rewrites: how many kept golds needed each rewrite (``"ilike"``, ...).
    """

    def __init__(self, tasks, *, name, split, refused=(), rewrites=None):
        super().__init__(tasks, name=name, split=split)
        self.refused: tuple[RefusedGold, ...] = tuple(refused)
        self.rewrites: Counter = Counter(rewrites or {})

    def refusal_counts(self) -> dict[str, int]:
        """How many golds were refused for each reason."""
        return dict(Counter(r.reason for r in self.refused))


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
) -> SpiderTasks:
    """Load Spider- or BIRD-format questions as VT-SQL tasks.

    Args:
        questions_path: ``dev.json`` / ``train_spider.json`` / BIRD's ``dev.json``.
        database_dir: the folder holding ``<db_id>/<db_id>.sqlite``.
        tables_path: ``tables.json`` (keys shown in the schema); optional.
        name: the source name used in task ids (default: the questions file stem).
        limit: load only the first ``limit`` records.
        use_evidence: append BIRD's ``evidence`` to the question as a hint.
        on_gold_error: what to do with a record whose gold cannot be carried
            to DuckDB with its SQLite result (see :data:`REFUSAL_REASONS`):
            ``"drop"`` it, ``"keep"`` it (it may score wrongly), or ``"raise"``.
        gold_timeout_s: time limit of each gold run (on each side).

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
    databases: dict[str, _Database] = {}
    tasks, refused, rewrites = [], [], Counter()
    for index, record in enumerate(records):
        missing = [f for f in ("question", "db_id") if f not in record]
        if missing:
            raise DatasetFormatError(
                f"{questions_path}: record {index} has no field(s) {missing}; "
                f"it has {sorted(record)}"
            )
        db_id = str(record["db_id"])
        if db_id not in databases:
            databases[db_id] = _Database.open(database_dir / db_id / f"{db_id}.sqlite", table_keys)
        db = databases[db_id]
        sqlite_sql = _gold_of(record, index, str(questions_path))
        gold, kinds, problem = _carry_gold(db, sqlite_sql, gold_timeout_s)
        if problem is not None:
            reason, detail = problem
            refusal = RefusedGold(index, db_id, reason, detail, sqlite_sql, gold)
            if on_gold_error == "raise":
                raise DatasetFormatError(
                    f"{questions_path}: record {index} ({db_id}): the gold SQL cannot be carried "
                    f"to DuckDB ({reason}: {detail}); pass on_gold_error='drop' to skip such "
                    "records"
                )
            refused.append(refusal)
            if on_gold_error == "drop":
                continue
            gold = gold or sqlite_sql_to_duckdb(sqlite_sql)
        else:
            rewrites.update(kinds)
        question = str(record["question"]).strip()
        evidence = str(record.get("evidence") or "").strip()
        if use_evidence and evidence:
            question += f"\nHint: {evidence}"
        task_key = record.get("question_id", index)
        metadata = {"db_id": db_id, "source": name}
        if "difficulty" in record:
            metadata["difficulty"] = record["difficulty"]
        schema = schema_text(db.duckdb_path, schema_sample_rows, db.keys_json)
        tasks.append(
            Task(
                id=f"{name}/{task_key}",
                prompt=format_prompt(db_id, "", schema, question),
                gold=gold,
                metadata=metadata,
                assets={"db_path": db.duckdb_path, "db_id": db_id},
            )
        )
    for db in databases.values():
        db.close()
    if refused:
        counts = Counter(r.reason for r in refused)
        logger.warning(
            "%s: %s %d of %d records whose gold SQL cannot be carried from SQLite to DuckDB "
            "(%s; first: %s)",
            questions_path,
            "kept" if on_gold_error == "keep" else "dropped",
            len(refused),
            len(records),
            ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())),
            [r.index for r in refused[:10]],
        )
    return SpiderTasks(tasks, name=name, split=split, refused=refused, rewrites=rewrites)


@dataclass
class _Database:
    """One Spider database: its SQLite file, DuckDB copy, column types and keys."""

    sqlite: sqlite3.Connection
    duckdb: duckdb.DuckDBPyConnection
    duckdb_path: str
    keys_json: str
    schema: dict[str, dict[str, str]]

    @classmethod
    def open(cls, sqlite_path: Path, table_keys: Mapping[str, Keys]) -> _Database:
        path, sqlite_keys = convert_sqlite(sqlite_path)
        keys = table_keys.get(sqlite_path.stem, sqlite_keys)
        con = connect_readonly(path)
        schema: dict[str, dict[str, str]] = {}
        for table, column, kind in con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() ORDER BY table_name"
        ).fetchall():
            schema.setdefault(table, {})[column] = kind
        src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True, check_same_thread=False)
        src.text_factory = lambda raw: raw.decode("utf-8", "replace")
        return cls(src, con, str(path), json.dumps(keys, sort_keys=True), schema)

    def close(self) -> None:
        self.sqlite.close()
        self.duckdb.close()


def _run_sqlite(con: sqlite3.Connection, sql: str, timeout_s: float) -> list[tuple]:
    deadline = time.monotonic() + timeout_s
    con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.set_progress_handler(None, 0)


def _run_duckdb(db: _Database, sql: str, timeout_s: float) -> tuple[list | None, str]:
    outcome = execute_query(db.duckdb, sql, timeout_s=timeout_s)
    if not outcome.ok:
        first_line = (outcome.message or "").splitlines()[:1]
        return None, f"{outcome.error}: {''.join(first_line)}"
    return list(outcome.rows), ""


def _carry_gold(
    db: _Database, sqlite_sql: str, timeout_s: float
) -> tuple[str, tuple[str, ...], tuple[str, str] | None]:
    """The DuckDB gold, its rewrites, and ``(reason, detail)`` if it must be refused."""
    try:
        expected = _run_sqlite(db.sqlite, sqlite_sql, timeout_s)
    except (sqlite3.Error, OverflowError, ValueError) as error:
        return "", (), ("sqlite_error", f"{type(error).__name__}: {error}")
    try:
        carried = sqlite_to_duckdb(sqlite_sql, db.schema)
    except TranspileError as error:
        return "", (), ("parse_error", str(error))
    rows, error = _run_duckdb(db, carried.sql, timeout_s)
    if rows is None:
        return carried.sql, carried.rewrites, ("duckdb_error", error)
    if not expected or all(v is None for row in expected for v in row):
        return carried.sql, carried.rewrites, ("empty_result", f"{len(expected)} row(s), no value")
    order = has_top_level_order_by(carried.sql)
    if "bare_column_any" in carried.rewrites:
        for bare in ("min", "max"):
            variant = sqlite_to_duckdb(sqlite_sql, db.schema, bare=bare).sql
            other, _ = _run_duckdb(db, variant, timeout_s)
            if other is None or not results_match(rows, other, order_matters=order):
                detail = "a bare column's value depends on which row of its group is read"
                return carried.sql, carried.rewrites, ("ambiguous", detail)
    if not results_match(expected, rows, order_matters=order):
        detail = f"SQLite {_preview(expected)} vs DuckDB {_preview(rows)}"
        return carried.sql, carried.rewrites, ("result_mismatch", detail)
    return carried.sql, carried.rewrites, None


def _preview(rows: Sequence[Sequence[Any]], n: int = 3) -> str:
    shown = [tuple(row) for row in rows[:n]]
    more = f" +{len(rows) - n} more" if len(rows) > n else ""
    return f"{len(rows)} row(s) {shown}{more}"
