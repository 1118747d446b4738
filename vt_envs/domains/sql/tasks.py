"""The task source of VT-SQL-v0's embedded databases, and the prompt each task shows.

A task's prompt is the database's name and description, its schema
(:func:`~vt_envs.domains.sql.schema.render_schema`, with
``schema_sample_rows`` sample rows per table) and the question. ``gold`` is
the gold SQL; ``assets`` hold ``db_path`` and ``db_id``; ``metadata`` holds
the database, template, difficulty and skills (never the SQL).

Task ``i`` of a split cycles through the chosen databases: it is question
``i // n`` of database ``databases[i % n]``, with the id
``sql/<db>/<split>/<i // n>``, so an id names the same question whichever
databases are chosen.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from vt_envs.core.task import SPLITS, GeneratedTasks, Task
from vt_envs.domains.sql.databases import EMBEDDED_DATABASES, connect_readonly, database_path
from vt_envs.domains.sql.questions import QuestionBank
from vt_envs.domains.sql.schema import render_schema
from vt_envs.errors import InvalidConfigError, UnknownNameError, UnknownTaskError

__all__ = ["DEFAULT_SIZES", "format_prompt", "sql_tasks"]

#: Questions per database in each split (train is drawn lazily, so its size is nominal).
DEFAULT_SIZES = {"train": 10_000, "test": 100}


def format_prompt(db_id: str, description: str, schema: str, question: str) -> str:
    """The user message of a SQL task."""
    about = f": {description}" if description else ""
    return f"Database `{db_id}`{about}.\n\nSchema:\n{schema}\n\nQuestion: {question}"


@functools.lru_cache(maxsize=64)
def schema_text(db_path: str, sample_rows: int, keys_json: str = "") -> str:
    """The rendered schema of ``db_path`` (cached; ``keys_json`` is the keys as JSON)."""
    keys = json.loads(keys_json) if keys_json else None
    con = connect_readonly(db_path)
    try:
        return render_schema(con, keys=keys, sample_rows=sample_rows)
    finally:
        con.close()


@functools.lru_cache(maxsize=16)
def _bank(db_name: str, db_path: str) -> QuestionBank:
    # Shared by every env in the process: generated questions are cached here.
    return QuestionBank(db_name, db_path)


def sql_tasks(
    split: str = "train",
    *,
    databases: Sequence[str] = ("flights", "tpch", "shop"),
    size_per_database: int | None = None,
    schema_sample_rows: int = 3,
) -> GeneratedTasks:
    """The embedded task source of VT-SQL-v0 for ``split``.

    Databases are built (or found in the cache) here, so the first call may
    take a few seconds.
    """
    if split not in SPLITS:
        raise InvalidConfigError(f"split must be one of {SPLITS}, got {split!r}")
    databases = tuple(databases)
    if not databases:
        raise InvalidConfigError(
            f"databases must name at least one of {list(EMBEDDED_DATABASES)}, got ()"
        )
    for name in databases:
        if name not in EMBEDDED_DATABASES:
            raise UnknownNameError("embedded SQL database", name, EMBEDDED_DATABASES)
    if schema_sample_rows < 0:
        raise InvalidConfigError(f"schema_sample_rows must be >= 0, got {schema_sample_rows}")
    per_db = size_per_database or DEFAULT_SIZES[split]
    paths = {name: str(database_path(name)) for name in databases}

    def generate(split: str, index: int) -> Task:
        name = databases[index % len(databases)]
        k = index // len(databases)
        spec = EMBEDDED_DATABASES[name]
        generated = _bank(name, paths[name]).question(split, k)
        keys = _keys_json(spec.keys)
        schema = schema_text(paths[name], schema_sample_rows, keys)
        template = generated.template
        return Task(
            id=f"sql/{name}/{split}/{k}",
            prompt=format_prompt(name, spec.description, schema, generated.question),
            gold=generated.sql,
            metadata={
                "db_id": name,
                "template": template.id,
                "difficulty": template.difficulty,
                "skills": list(template.skills),
            },
            assets={"db_path": paths[name], "db_id": name},
        )

    return _SQLTasks(generate, per_db * len(databases), databases=databases, split=split)


class _SQLTasks(GeneratedTasks):
    """Generated SQL tasks whose ids map straight to indices, so ``get(id)`` does
    not generate the whole split to find one task."""

    def __init__(self, generate, size: int, *, databases: tuple[str, ...], split: str):
        super().__init__(generate, size, name="sql", split=split)
        self._databases = databases

    def find(self, task_id: str, *, scan: bool = True) -> Task | None:
        parts = task_id.split("/")
        if len(parts) == 4 and parts[0] == "sql" and parts[2] == self.split:
            db, k = parts[1], parts[3]
            if db in self._databases and k.isdigit() and len(k) <= 18:
                index = int(k) * len(self._databases) + self._databases.index(db)
                if index < len(self):
                    return self[index]
        return None  # every id maps to its index: nothing to scan for

    def get(self, task_id: str) -> Task:
        task = self.find(task_id)
        if task is None:
            examples = [self[i].id for i in range(min(5, len(self)))]
            raise UnknownTaskError(task_id, f"{self.name}/{self.split}", examples)
        return task


def _keys_json(keys: Mapping[str, Any]) -> str:
    return json.dumps(keys, sort_keys=True)
