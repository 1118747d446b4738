"""A keyword of the wrong type is refused when the env is built, by name, for every id:
not accepted and misread (``boxed_answers="no"`` is truthy; ``answer_tags="answer"``
is six one-letter tags), not a ``TypeError`` inside a tool at the first step."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Literal

import gymnasium as gym
import numpy as np
import pytest

import vt_envs  # noqa: F401  (registers the ids)
from vt_envs.core.env import ToolEnv
from vt_envs.core.keyword_types import keyword_hints, matches
from vt_envs.errors import InvalidConfigError
from vt_envs.registration import builder_of

IDS = ["VT-Lookup-v0", "VT-Math-v0", "VT-Visual-v0", "VT-SQL-v0", "VT-Search-v0",
       "VT-Multi-v0", "VT-SWE-v0"]  # fmt: skip

#: Values a YAML file or a command line easily produces, each silently misread
#: without the check (a truthy string, a string iterated as a sequence, a float count).
WRONG = {
    "boxed_answers": "no",
    "remind_turns_left": "false",
    "answer_tags": "answer",
    "max_turns": "8",
    "max_tool_calls": 2.5,
    "max_episode_tokens": True,
    "rewards": ["tool_error_penalty"],
}


@pytest.mark.parametrize("env_id", IDS)
def test_every_keyword_of_every_id_has_an_annotation_the_check_reads(env_id):
    """Otherwise the check would pass silently: no hint, nothing checked."""
    build = builder_of(env_id)
    hints = {**keyword_hints(ToolEnv.__init__), **keyword_hints(inspect.unwrap(build))}
    unchecked = set(build.accepted_kwargs) - set(hints) - {"tool_server", "tool_server_token"}
    assert not unchecked


@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize("key", sorted(WRONG))
def test_a_wrong_type_is_refused_by_name_through_gym_make(env_id, key):
    """Red-checked: without the check every id builds with boxed_answers="no". (A
    keyword the domain sets itself is refused as such; one it renames, under its
    own name.)"""
    rules = builder_of(env_id).keyword_rules
    name = rules["renamed"].get(key, key)
    with pytest.raises(InvalidConfigError) as error:
        gym.make(env_id, **{key: WRONG[key]})
    said = str(error.value)
    assert f"{name} must be " in said or f"sets {key}=" in said, said
    assert repr(WRONG[key]) in said or key in rules["fixed"], said


def test_a_domain_keyword_is_checked_under_the_builders_own_name():
    with pytest.raises(InvalidConfigError, match="top_k must be int, got '3'"):
        gym.make("VT-Search-v0", retriever="bm25", top_k="3")
    with pytest.raises(InvalidConfigError, match="max_searches must be int"):  # renamed
        gym.make("VT-Search-v0", retriever="bm25", max_tool_calls="2")
    with pytest.raises(InvalidConfigError, match=r"families must be Sequence\[str\]"):
        gym.make("VT-Math-v0", families="modpow")


@pytest.mark.parametrize(
    ("value", "hint", "expected"),
    [
        (3, int, True), (np.int64(3), int, True), (True, int, False), (3.0, int, False),
        (3, float, True), (np.float32(0.5), float, True), (False, float, False),
        (None, int | None, True), ("x", int | None, False),
        (["a", "b"], Sequence[str], True), (("a",), Sequence[str], True),
        ("ab", Sequence[str], False), ([1, "a"], Sequence[int], False),
        ((1, 2), Sequence[int] | int, True), ({"a": 1.0}, Mapping[str, float], True),
        ([("a", 1)], Mapping[str, float], False), ("p", str | os.PathLike[str], True),
        ("chat", Literal["chat", "inline"], True), ("html", Literal["chat", "inline"], False),
        (object(), object, True),
    ],
)  # fmt: skip
def test_what_matches_an_annotation(value, hint, expected):
    assert matches(value, hint) is expected
