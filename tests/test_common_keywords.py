"""Every env id accepts every common ``ToolEnv`` keyword through ``gym.make``, or
refuses it with a typed error that says why; never a bare ``TypeError``.

The review reproduced ``gym.make("VT-Visual-v0", action_format="tags")``,
``gym.make("VT-Search-v0", max_tool_calls=2)`` and ``gym.make("VT-SWE-v0",
action_format="json")`` raising ``TypeError: ToolEnv() got multiple values for
keyword argument``: a builder that set a common keyword itself also forwarded
the user's.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.errors import InvalidConfigError, VTError
from vt_envs.registration import TOOL_ENV_KWARGS

#: A valid value for each common keyword, not its default (so forwarding shows).
SAMPLES = {
    "tokenizer": None,
    "observation_format": "inline",
    "inline_template": "\n<out>\n{text}\n</out>\n",
    "action_format": "json",
    "chat_template_kwargs": {},
    "template_tools": False,
    "max_turns": 3,
    "max_tool_calls": 2,
    "max_calls_per_turn": 2,
    "max_episode_tokens": 7000,
    "max_episode_seconds": 90.0,
    "max_observation_tokens": 300,
    "verify_timeout_s": 50.0,
    "answer_tags": ("answer",),
    "boxed_answers": True,
    "remind_turns_left": True,
    "rewards": {"invalid_action_penalty": 0.1},
    "render_mode": "ansi",
    "grade_truncated": True,
    "examples": [],
    "extra_tools": ["python"],  # Math and Multi have one: refused there, naming it
}
#: Image keywords: text envs refuse them (typed), image envs take them.
IMAGE_ONLY = {"task_images", "processor", "max_image_tokens"}
#: How a built env exposes a keyword, where the name differs or it is not stored.
UNCHECKED = {"tokenizer", "inline_template", "chat_template_kwargs", "template_tools",
             "rewards", "examples", "answer_tags", "boxed_answers", "verify_timeout_s",
             "remind_turns_left", "grade_truncated", "max_calls_per_turn",
             "action_format"}  # fmt: skip

IDS = ["VT-Lookup-v0", "VT-Math-v0", "VT-Visual-v0", "VT-SQL-v0", "VT-Search-v0",
       "VT-Multi-v0", "VT-SWE-v0"]  # fmt: skip


def test_the_samples_cover_every_common_keyword():
    assert set(SAMPLES) | IMAGE_ONLY == set(TOOL_ENV_KWARGS)


def _outcome(env_id: str, kwargs: dict) -> VTError | None:
    """None if ``gym.make`` built the env with ``kwargs`` in effect; the typed error if
    it refused them. Anything else (a bare TypeError) fails the test."""
    try:
        env = gym.make(env_id, **kwargs)
    except VTError as error:
        return error
    try:
        inner = env.unwrapped
        for key, value in kwargs.items():
            if key not in UNCHECKED and hasattr(inner, key):
                assert getattr(inner, key) == value, (env_id, key)
    finally:
        env.close()
    return None


@pytest.mark.parametrize("env_id", IDS)
def test_every_id_takes_every_common_keyword_or_refuses_it_typed(env_id):
    together = _outcome(env_id, SAMPLES)
    if together is None:
        return  # every keyword accepted at once, and in effect
    refused = {}
    for key, value in SAMPLES.items():
        error = _outcome(env_id, {key: value})
        if error is not None:
            assert key in str(error), (key, error)  # the message names the keyword
            refused[key] = error
    assert refused, f"{env_id} refused the keywords together but none alone: {together}"


@pytest.mark.parametrize("env_id", ["VT-Lookup-v0", "VT-Math-v0"])
def test_a_text_env_refuses_image_keywords_typed(env_id):
    with pytest.raises(InvalidConfigError, match="max_image_tokens"):
        gym.make(env_id, max_image_tokens=256)


def test_a_fixed_keyword_is_refused_with_the_reason_and_the_same_value_is_accepted():
    with pytest.raises(InvalidConfigError, match="action_format='json' itself"):
        gym.make("VT-Visual-v0", action_format="tags")
    gym.make("VT-Visual-v0", action_format="json").close()


def test_a_renamed_keyword_reaches_the_domain_setting():
    env = gym.make("VT-Search-v0", retriever="bm25", max_tool_calls=2)
    try:
        assert env.unwrapped.max_tool_calls == 2
    finally:
        env.close()
    with pytest.raises(InvalidConfigError, match="same setting"):
        vt_envs.make("VT-Search-v0", retriever="bm25", max_tool_calls=2, max_searches=3)
