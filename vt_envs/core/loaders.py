"""Loading tasks from the dataset files users bring (JSONL, JSON, Parquet).

Benchmarks ship their data in a handful of formats with their own field
names (GSM8K: ``question``/``answer``; MATH: ``problem``/``solution``;
Search-R1: ``question``/``golden_answers``). :class:`FieldMap` says which
record field becomes which :class:`~vt_envs.core.task.Task` attribute, with
an optional transform for the gold answer, so one loader serves all of them.

Parquet is read with DuckDB (a core dependency), so no pyarrow is needed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vt_envs.core.task import Task, TaskList
from vt_envs.errors import DatasetFormatError

__all__ = ["FieldMap", "load_tasks", "read_records"]

FORMATS = ("jsonl", "json", "parquet")


@dataclass(frozen=True)
class FieldMap:
    """Which record fields make a task.

    Attributes:
        prompt: the field holding the question shown to the agent.
        gold: the field holding the reference answer.
        id: the field holding a unique id; ``None`` numbers records in file
            order (``"{name}/{split}/{index}"``).
        metadata: fields copied into ``Task.metadata`` (never the gold).
        assets: fields copied into ``Task.assets``.
        gold_transform: maps the raw gold value to what the verifier expects
            (e.g. GSM8K's ``"... #### 42"`` → ``"42"``).
        prompt_transform: maps the whole record to the prompt text, for
            formats whose question spans several fields (BIRD's evidence).
    """

    prompt: str = "question"
    gold: str = "answer"
    id: str | None = None
    metadata: Sequence[str] = ()
    assets: Sequence[str] = ()
    gold_transform: Callable[[Any], Any] | None = None
    prompt_transform: Callable[[Mapping[str, Any]], str] | None = None
    required: Sequence[str] = field(default=())

    def fields(self) -> list[str]:
        names = [self.gold, *self.metadata, *self.assets, *self.required]
        if self.prompt_transform is None:
            names.append(self.prompt)
        if self.id is not None:
            names.append(self.id)
        return names


def _detect_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    raise DatasetFormatError(
        f"cannot tell the format of {str(path)!r} from its suffix {path.suffix!r}; "
        f"expected one of {['.' + f for f in FORMATS]} (or pass format=...)"
    )


def read_records(
    path: str | os.PathLike[str], *, format: str | None = None
) -> list[dict[str, Any]]:
    """Read every record of a JSONL, JSON (a list of objects) or Parquet file."""
    path = Path(path)
    fmt = format or _detect_format(path)
    if not path.exists():
        raise DatasetFormatError(f"dataset file {str(path)!r} does not exist")
    if fmt == "jsonl":
        records = []
        with path.open(encoding="utf-8") as f:
            try:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DatasetFormatError(
                            f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
                        ) from None
            except UnicodeDecodeError as exc:
                raise DatasetFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
        return records
    if fmt == "json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DatasetFormatError(f"{path}: not valid UTF-8 JSON ({exc})") from None
        if isinstance(data, Mapping):  # {"data": [...]} wrappers are common
            lists = [v for v in data.values() if isinstance(v, list)]
            data = lists[0] if len(lists) == 1 else data
        if not isinstance(data, list):
            raise DatasetFormatError(f"{path}: expected a JSON list of objects")
        return data
    if fmt == "parquet":
        import duckdb

        con = duckdb.connect()
        try:
            cursor = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
            columns = [d[0] for d in cursor.description]
            return [dict(zip(columns, row)) for row in cursor.fetchall()]
        except duckdb.Error as exc:
            raise DatasetFormatError(f"{path}: not a readable Parquet file ({exc})") from None
        finally:
            con.close()
    raise DatasetFormatError(f"format must be one of {FORMATS}, got {fmt!r}")


def load_tasks(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    fields: FieldMap,
    *,
    name: str,
    split: str = "test",
    format: str | None = None,
    limit: int | None = None,
) -> TaskList:
    """Build a :class:`TaskList` from a file (or an iterable of records).

    Every record must have the fields ``fields`` names; the first record that
    lacks one raises :class:`DatasetFormatError` naming the field and the
    fields the record does have.
    """
    if isinstance(source, (str, os.PathLike)):
        records: Iterable[Mapping[str, Any]] = read_records(source, format=format)
        origin = str(source)
    else:
        records, origin = source, f"{name} records"
    tasks = []
    for index, record in enumerate(records):
        if limit is not None and index >= limit:
            break
        missing = [f for f in fields.fields() if f not in record]
        if missing:
            raise DatasetFormatError(
                f"{origin}: record {index} has no field(s) {missing}; it has {sorted(record)}. "
                "Map the right names with FieldMap(prompt=..., gold=..., id=...)."
            )
        gold = record[fields.gold]
        if fields.gold_transform is not None:
            gold = fields.gold_transform(gold)
        prompt = (
            fields.prompt_transform(record)
            if fields.prompt_transform is not None
            else str(record[fields.prompt])
        )
        task_id = str(record[fields.id]) if fields.id else f"{name}/{split}/{index}"
        tasks.append(
            Task(
                id=task_id,
                prompt=prompt,
                gold=gold,
                metadata={k: record[k] for k in fields.metadata},
                assets={k: record[k] for k in fields.assets},
            )
        )
    return TaskList(tasks, name=name, split=split)
