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
from vt_envs.errors import DatasetFormatError, InvalidConfigError


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
    tasks = load_gsm8k(path, holdout=1.0)
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
    tasks = load_math(path, name="math500", holdout=1.0)
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
    tasks = load_math_dataset(path, holdout=1.0)
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
    tasks = load_competition(path, name="aime24", holdout=1.0)
    assert [t.id for t in tasks] == ["2024-I-1", "2024-I-2"]
    assert [t.gold for t in tasks] == ["204", "025"]
    assert tasks[0].prompt == "Find n."


def test_amc_jsonl_question_answer(tmp_path):
    path = _jsonl(
        tmp_path / "amc23.jsonl", [{"question": "What is 2+2?", "answer": 4.0, "url": "u"}]
    )
    tasks = load_math_dataset(path, holdout=1.0)
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
    tasks = load_deepmath(path, holdout=0.0)
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
    tasks = load_math_dataset(path, split="train")  # its own extra_info.split
    assert tasks[0].prompt == "What is 6*7?"
    assert tasks[0].gold == "42"
    assert tasks[0].id == "math_dapo/17"
    assert tasks[0].metadata["layout"] == "verl"


def test_field_map_override_for_other_column_names(tmp_path):
    path = _parquet(
        tmp_path / "custom.parquet", "SELECT 'q1' AS query, 'sol #### 9' AS target, 'k1' AS key"
    )
    tasks = load_deepmath(
        path,
        fields=FieldMap(prompt="query", gold="target", id="key", gold_transform=gsm8k_gold),
        holdout=0.0,
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
    tasks = load_gsm8k(path, split="train", holdout=0.0, limit=2)
    assert len(tasks) == 2 and tasks.split == "train" and tasks[1].id == "gsm8k/train/1"


def test_champ_loads_when_installed():
    pytest.importorskip("champ_dataset")
    tasks = load_champ(holdout=1.0)
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


# --- splits on user data are real (issue 31) ---------------------------------------------


def _many(tmp_path, n=400, **extra):
    records = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), **extra} for i in range(n)]
    return _jsonl(tmp_path / "many.jsonl", records)


def test_split_on_user_data_is_a_seeded_hash_partition_through_gym_make(tmp_path):
    import gymnasium as gym

    path = _many(tmp_path)
    prompts = {}
    for split in ("train", "test"):
        env = gym.make("VT-Math-v0", dataset=str(path), split=split)
        prompts[split] = {t.prompt for t in env.unwrapped.tasks}
        assert env.unwrapped.tasks.split == split
        env.close()
    assert not prompts["train"] & prompts["test"]
    assert len(prompts["train"] | prompts["test"]) == 400
    assert 0.05 <= len(prompts["test"]) / 400 <= 0.15  # DEFAULT_HOLDOUT = 0.1
    again = load_math_dataset(path, split="test")
    assert {t.prompt for t in again} == prompts["test"]  # stable
    other = load_math_dataset(path, split="test", holdout_seed=1)
    assert {t.prompt for t in other} != prompts["test"]
    assert len(load_math_dataset(path, split="test", holdout=0.5)) > 150


def test_a_whole_file_is_one_split_only_when_asked_and_the_empty_side_is_refused(tmp_path):
    path = _many(tmp_path, n=20)
    assert len(load_math_dataset(path, split="test", holdout=1.0)) == 20
    assert len(load_math_dataset(path, split="train", holdout=0.0)) == 20
    with pytest.raises(DatasetFormatError, match=r"holdout=1\.0 with split='test'"):
        load_math_dataset(path, split="train", holdout=1.0)
    with pytest.raises(DatasetFormatError, match="empty"):
        load_math_dataset(path, split="test", holdout=0.0)
    with pytest.raises(InvalidConfigError, match="between 0 and 1"):
        load_math_dataset(path, holdout=10)
    with pytest.raises(InvalidConfigError, match="split must be one of"):
        load_math_dataset(path, split="validation")


def test_the_datas_own_split_field_is_honoured_or_refused(tmp_path):
    records = [
        {"question": f"q{i}", "answer": str(i), "split": "train" if i % 3 else "test"}
        for i in range(12)
    ]
    path = _jsonl(tmp_path / "own.jsonl", records)
    test = load_math_dataset(path, split="test")
    assert [t.prompt for t in test] == ["q0", "q3", "q6", "q9"]
    assert len(load_math_dataset(path, split="train")) == 8
    only_train = _jsonl(
        tmp_path / "train_only.jsonl", [r for r in records if r["split"] == "train"]
    )
    with pytest.raises(DatasetFormatError, match="own split field holds \\['train'\\]"):
        load_math_dataset(only_train, split="test")


def test_the_math_release_tree_of_one_problem_files_loads(tmp_path):
    import gymnasium as gym

    root = tmp_path / "MATH"
    problems = {
        "train/algebra/1.json": ("Solve $x+1=3$.", "Algebra", "We get $x=\\boxed{2}$."),
        "train/number_theory/7.json": (
            "Find $7 \\bmod 4$.",
            "Number Theory",
            "First \\boxed{1}, then \\boxed{3}.",
        ),
        "test/geometry/12.json": ("Area?", "Geometry", "It is $\\boxed{\\frac{1}{2}}$."),
    }
    for rel, (problem, kind, solution) in problems.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"problem": problem, "level": "Level 2", "type": kind, "solution": solution}
        path.write_text(json.dumps(record), encoding="utf-8")
    train = load_math_dataset(root, split="train")
    assert [(t.id, t.gold) for t in train] == [
        ("MATH/train/algebra/1", "2"),
        ("MATH/train/number_theory/7", "3"),  # the last \boxed{}
    ]
    assert train[1].metadata["type"] == "Number Theory"
    assert train[1].metadata["level"] == "Level 2" and train[1].metadata["layout"] == "math"
    env = gym.make("VT-Math-v0", dataset=str(root), split="test")
    assert [(t.prompt, t.gold) for t in env.unwrapped.tasks] == [("Area?", "\\frac{1}{2}")]
    env.close()
    one = load_math(root / "test" / "geometry" / "12.json", holdout=1.0)
    assert [(t.prompt, t.gold) for t in one] == [("Area?", "\\frac{1}{2}")]
    assert len(load_math_dataset(root / "train", split="train")) == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match="json files"):
        load_math_dataset(tmp_path / "empty")
