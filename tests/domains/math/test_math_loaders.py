"""Math dataset loaders, each on a small fixture file written here."""

from __future__ import annotations

import json

import duckdb
import pytest

from vt_envs.core.loaders import FieldMap
from vt_envs.domains.math.loaders import (
    detect_layout,
    gsm8k_gold,
    load_champ,
    load_competition,
    load_deepmath,
    load_gsm8k,
    load_math,
    load_math_dataset,
    math_gold,
)
from vt_envs.errors import DatasetFormatError


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _parquet(path, select_sql):
    con = duckdb.connect()
    con.execute(f"COPY ({select_sql}) TO '{path}' (FORMAT parquet)")
    con.close()
    return path


def test_gsm8k_jsonl(tmp_path):
    path = _jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {
                "question": "Tom has 3 apples and buys 4. How many?",
                "answer": "3+4=<<3+4=7>>7\n#### 7",
            },
            {"question": "Big?", "answer": "It costs\n#### 1,200"},
        ],
    )
    tasks = load_gsm8k(path)
    assert [t.gold for t in tasks] == ["7", "1200"]
    assert tasks[0].prompt.startswith("Tom has 3")
    assert tasks[0].id == "gsm8k/test/0"
    assert tasks[0].metadata == {"layout": "gsm8k", "source": "gsm8k"}


def test_gsm8k_answer_without_marker_raises(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "7"}])
    with pytest.raises(DatasetFormatError, match="####"):
        load_gsm8k(path)


def test_gsm8k_gold():
    assert gsm8k_gold("a\n#### 1,234,567") == "1234567"
    assert gsm8k_gold("#### -3.5") == "-3.5"


def test_math500_jsonl_uses_answer_and_unique_id(tmp_path):
    path = _jsonl(
        tmp_path / "math500.jsonl",
        [
            {
                "problem": "Compute $1+1$.",
                "solution": "So \\boxed{2}.",
                "answer": "2",
                "subject": "Algebra",
                "level": 1,
                "unique_id": "test/algebra/1.json",
            },
            {
                "problem": "Half?",
                "solution": "\\boxed{\\frac{1}{2}}",
                "answer": "\\frac{1}{2}",
                "subject": "Algebra",
                "level": 2,
                "unique_id": "test/algebra/2.json",
            },
        ],
    )
    tasks = load_math(path, name="math500")
    assert tasks[0].id == "test/algebra/1.json"
    assert tasks[1].gold == "\\frac{1}{2}"
    assert tasks[0].metadata["level"] == 1 and tasks[0].metadata["subject"] == "Algebra"
    assert tasks.get("test/algebra/2.json").prompt == "Half?"


def test_original_math_takes_the_last_boxed_of_the_solution(tmp_path):
    path = _jsonl(
        tmp_path / "math.jsonl",
        [
            {
                "problem": "p",
                "level": "Level 3",
                "type": "Geometry",
                "solution": "First \\boxed{1}, finally $\\boxed{\\frac{\\sqrt{3}}{2}}$.",
            },
        ],
    )
    tasks = load_math_dataset(path)
    assert tasks[0].gold == "\\frac{\\sqrt{3}}{2}"
    assert tasks[0].metadata["type"] == "Geometry"
    assert tasks[0].metadata["layout"] == "math"


def test_math_gold_without_answer_or_box_raises():
    with pytest.raises(DatasetFormatError, match="boxed"):
        math_gold({"problem": "p", "solution": "no box"})


def test_aime_jsonl_with_capitalised_fields(tmp_path):
    path = _jsonl(
        tmp_path / "aime24.jsonl",
        [
            {"ID": "2024-I-1", "Problem": "Find n.", "Answer": 204, "Solution": "..."},
            {"ID": "2024-I-2", "Problem": "Find m.", "Answer": "025", "Solution": "..."},
        ],
    )
    tasks = load_competition(path, name="aime24")
    assert [t.id for t in tasks] == ["2024-I-1", "2024-I-2"]
    assert [t.gold for t in tasks] == ["204", "025"]
    assert tasks[0].prompt == "Find n."


def test_amc_jsonl_question_answer(tmp_path):
    path = _jsonl(
        tmp_path / "amc23.jsonl", [{"question": "What is 2+2?", "answer": 4.0, "url": "u"}]
    )
    tasks = load_math_dataset(path)
    assert tasks[0].gold == "4.0" and tasks[0].metadata["layout"] == "qa"
    assert tasks[0].metadata["source"] == "amc23"


def test_deepmath_parquet(tmp_path):
    path = _parquet(
        tmp_path / "deepmath.parquet",
        """
        SELECT * FROM (VALUES
            ('Evaluate the limit.', '0', 6.5, 'Calculus', 'long r1 solution'),
            ('Find x.', '\\frac{1}{2}', 4.0, 'Algebra', 'sol')
        ) t(question, final_answer, difficulty, topic, r1_solution_1)""",
    )
    tasks = load_deepmath(path)
    assert [t.gold for t in tasks] == ["0", "\\frac{1}{2}"]
    assert tasks[0].metadata["difficulty"] == 6.5
    assert tasks[0].metadata["topic"] == "Calculus"
    assert tasks[0].id == "deepmath/train/0"


def test_torl_verl_parquet(tmp_path):
    path = _parquet(
        tmp_path / "torl.parquet",
        """
        SELECT 'math_dapo' AS data_source,
               [{'role': 'system', 'content': 'Be brief.'},
                {'role': 'user', 'content': 'What is 6*7?'}] AS prompt,
               'math' AS ability,
               {'style': 'rule', 'ground_truth': '42'} AS reward_model,
               {'split': 'train', 'index': 17} AS extra_info""",
    )
    tasks = load_math_dataset(path)
    assert tasks[0].prompt == "What is 6*7?"
    assert tasks[0].gold == "42"
    assert tasks[0].id == "math_dapo/17"
    assert tasks[0].metadata["layout"] == "verl"


def test_field_map_override_for_other_column_names(tmp_path):
    path = _parquet(
        tmp_path / "custom.parquet", "SELECT 'q1' AS query, 'sol #### 9' AS target, 'k1' AS key"
    )
    tasks = load_deepmath(
        path, fields=FieldMap(prompt="query", gold="target", id="key", gold_transform=gsm8k_gold)
    )
    assert (tasks[0].id, tasks[0].prompt, tasks[0].gold) == ("k1", "q1", "9")


def test_unknown_layout_raises_with_the_fields(tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"text": "?", "label": 1}])
    with pytest.raises(DatasetFormatError, match="label"):
        load_math_dataset(path)


@pytest.mark.parametrize(
    "record, layout",
    [
        ({"question": "q", "answer": "x #### 1"}, "gsm8k"),
        ({"problem": "p", "solution": "s"}, "math"),
        ({"question": "q", "final_answer": "1"}, "deepmath"),
        ({"prompt": [], "reward_model": {}}, "verl"),
        ({"problem": "p", "answer": "1"}, "qa"),
        ({"question": "q", "answer": "1"}, "qa"),
    ],
)
def test_detect_layout(record, layout):
    assert detect_layout(record) == layout


def test_limit_and_split(tmp_path):
    path = _jsonl(
        tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    )
    tasks = load_gsm8k(path, split="train", limit=2)
    assert len(tasks) == 2 and tasks.split == "train" and tasks[1].id == "gsm8k/train/1"


def test_champ_loads_when_installed():
    pytest.importorskip("champ_dataset")
    tasks = load_champ()
    assert len(tasks) == 270
    assert tasks[0].id.startswith("champ/P_") and tasks[0].gold


def test_champ_missing_package_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "champ_dataset":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(DatasetFormatError, match="pip install"):
        load_champ()
