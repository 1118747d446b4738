"""Dataset loaders: JSONL / JSON / Parquet with field mapping, and their errors."""

from __future__ import annotations

import json

import duckdb
import pytest

from vt_envs.core.loaders import FieldMap, load_tasks, read_records
from vt_envs.errors import DatasetFormatError


def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")


def test_jsonl_with_gold_transform_and_metadata(tmp_path):
    path = tmp_path / "gsm.jsonl"
    write_jsonl(
        path,
        [
            {"question": "2+2?", "answer": "two and two\n#### 4", "level": 1},
            {"question": "3*3?", "answer": "#### 9", "level": 2},
        ],
    )
    fields = FieldMap(
        prompt="question",
        gold="answer",
        metadata=("level",),
        gold_transform=lambda a: a.split("####")[-1].strip(),
    )
    tasks = load_tasks(path, fields, name="gsm8k", split="test")
    assert [t.gold for t in tasks] == ["4", "9"]
    assert tasks[1].id == "gsm8k/test/1" and tasks[1].metadata == {"level": 2}
    assert tasks.get("gsm8k/test/0").prompt == "2+2?"


def test_parquet_keeps_lists(tmp_path):
    path = tmp_path / "nq.parquet"
    duckdb.execute(
        f"COPY (SELECT 'q' || i AS question, ['a' || i, 'b'] AS golden_answers, 'id' || i AS qid "
        f"FROM range(3) t(i)) TO '{path}' (FORMAT parquet)"
    )
    tasks = load_tasks(path, FieldMap(gold="golden_answers", id="qid"), name="nq")
    assert [t.id for t in tasks] == ["id0", "id1", "id2"]
    assert tasks[2].gold == ["a2", "b"]


def test_json_list_and_wrapped(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"problem": "p", "answer": "1"}]))
    (tmp_path / "b.json").write_text(json.dumps({"data": [{"problem": "p", "answer": "1"}]}))
    for name in ("a.json", "b.json"):
        assert read_records(tmp_path / name) == [{"problem": "p", "answer": "1"}]


def test_missing_field_names_field_and_fix(tmp_path):
    path = tmp_path / "x.jsonl"
    write_jsonl(path, [{"problem": "p", "answer": "1"}])
    with pytest.raises(DatasetFormatError) as err:
        load_tasks(path, FieldMap(), name="x")
    message = str(err.value)
    assert "record 0 has no field(s) ['question']" in message
    assert "it has ['answer', 'problem']" in message and "FieldMap(prompt=" in message


def test_bad_json_line_and_unknown_suffix(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n{oops\n')
    with pytest.raises(DatasetFormatError, match=r"bad.jsonl:2: not valid JSON"):
        read_records(path)
    with pytest.raises(DatasetFormatError, match="cannot tell the format"):
        read_records(tmp_path / "data.csv")


def test_limit(tmp_path):
    path = tmp_path / "x.jsonl"
    write_jsonl(path, [{"question": str(i), "answer": str(i)} for i in range(10)])
    assert len(load_tasks(path, FieldMap(), name="x", limit=3)) == 3
