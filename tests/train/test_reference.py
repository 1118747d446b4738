"""The recipe reference (docs/reference/recipe.md) is current, complete, and tells
the truth about defaults; an undocumented config field is refused."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from vt_train.algorithms import PRESETS, AlgorithmConfig
from vt_train.config import TrainConfig, load_config, resolved_config_dict
from vt_train.reference import (
    MAPPING_SECTIONS,
    REGENERATE,
    UndocumentedFieldError,
    main,
    preset_differences,
    recipe_fields,
    render_page,
)

PAGE = Path(__file__).parents[2] / "docs" / "reference" / "recipe.md"


@pytest.fixture(scope="module")
def fields():
    return recipe_fields()


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf field's dotted key, found without the module under test."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        nested = MAPPING_SECTIONS.get((cls, f.name), hints[f.name])
        if dataclasses.is_dataclass(nested):
            keys += _leaf_keys(nested, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def test_the_committed_page_is_the_generated_one():
    assert PAGE.exists(), f"docs/reference/recipe.md is missing; generate it: {REGENERATE}"
    assert PAGE.read_text() == render_page(), f"the page is stale; regenerate it: {REGENERATE}"


def test_every_field_of_every_nested_dataclass_appears_once_with_a_doc(fields):
    keys = [f.key for f in fields]
    assert Counter(keys) == Counter(_leaf_keys(TrainConfig))
    assert {"rollout.n", "algorithm.clip_high", "deepspeed.zero_stage", "tracker.tags"} <= set(keys)
    assert [f.key for f in fields if not f.doc.strip()] == []
    rows = re.findall(r"^\| `([\w.]+)` \|", PAGE.read_text().split("## Algorithm presets")[0], re.M)
    assert Counter(rows) == Counter(keys)


def _value_at(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


@pytest.mark.parametrize("recipe", ["defaults", "empty file", "one override"])
def test_documented_defaults_are_what_a_run_gets(fields, recipe, tmp_path):
    """Through load_config, what ``vt-train`` calls, and the resolved config it records."""
    if recipe == "defaults":
        config = load_config()
    elif recipe == "empty file":
        (tmp_path / "r.yaml").write_text("")
        config = load_config(tmp_path / "r.yaml")
    else:
        config = load_config(overrides=["steps=3"])
    resolved = resolved_config_dict(config)
    wrong = {
        f.key: (f.default, _value_at(resolved, f.key))
        for f in fields
        if f.key != "steps" and _value_at(resolved, f.key) != f.default
    }
    assert wrong == {}, "documented default != the run's value: " + repr(wrong)


def test_the_presets_table_is_what_algo_resolves_to():
    table = preset_differences()
    assert list(table) == PRESETS.names()
    assert table["grpo"] == {}  # the defaults are GRPO's
    assert table["dapo"]["clip_high"] == 0.28 and table["ppo"]["use_critic"] is True
    assert table["dr_grpo"]["loss_norm_tokens"] == TrainConfig().rollout.max_context
    for name, values in table.items():
        resolved = load_config(overrides=[f"algo={name}"]).algorithm_config()
        for key, value in values.items():
            assert getattr(resolved, key) == value != getattr(AlgorithmConfig(), key)
    assert "| `clip_high` | `0.2` | `0.28` |" in PAGE.read_text()


@dataclass
class _Inner:
    """A throwaway section.

    Attributes:
        ok: documented.
    """

    ok: int = 1
    missing: int = 2


@dataclass
class _Root:
    """A throwaway config.

    Attributes:
        name: documented.
        inner: a section.
    """

    name: str = "x"
    inner: _Inner = field(default_factory=_Inner)
    forgotten: list[str] = field(default_factory=list)


def test_an_undocumented_field_is_refused(monkeypatch):
    with pytest.raises(UndocumentedFieldError) as err:
        recipe_fields(_Root, mapping_sections={})
    assert "inner.missing, forgotten" in str(err.value)
    assert REGENERATE in str(err.value)

    monkeypatch.setattr(_Inner, "__doc__", _Inner.__doc__ + "    missing: now documented.\n")
    monkeypatch.setattr(_Root, "__doc__", _Root.__doc__ + "    forgotten: now documented.\n")
    got = {f.key: (f.default_text, f.type) for f in recipe_fields(_Root, mapping_sections={})}
    assert got == {
        "name": ("x", "str"),
        "inner.ok": ("1", "int"),
        "inner.missing": ("2", "int"),
        "forgotten": ("[]", "list[str]"),
    }


def test_check_exits_1_naming_the_regenerate_command_when_stale(tmp_path, capsys):
    out = tmp_path / "recipe.md"
    assert main(["--out", str(out), "--check"]) == 1  # missing
    assert main(["--out", str(out)]) == 0
    assert main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "an edit by hand\n")
    assert main(["--out", str(out), "--check"]) == 1
    assert REGENERATE in capsys.readouterr().err
