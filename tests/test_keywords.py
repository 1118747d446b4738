"""The env keyword reference (vt_envs.keyword_reference): complete, documented, current, and true.

True means the outsider's check: the page says a keyword defaults to X, and the env
``gym.make(id)`` builds uses X.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import vt_envs
from vt_envs import env_builder, keywords
from vt_envs.errors import InvalidConfigError, UnknownNameError
from vt_envs.keyword_reference import COMMAND, REFERENCE_PAGE, REQUIRED
from vt_envs.registration import builder_of

ROOT = Path(__file__).parents[1]
VT_IDS = [i for i in vt_envs.registered_envs() if i.startswith("VT-")]
#: Common keywords the built ToolEnv keeps as attributes of the same name and value.
STORED = ("max_turns", "max_tool_calls", "max_episode_tokens", "max_episode_seconds",
          "max_observation_tokens", "observation_format", "remind_turns_left",
          "grade_truncated", "render_mode", "max_image_tokens")  # fmt: skip
#: Env-own keywords that make an id cheap to build here, none of them in STORED: the
#: BM25 retriever (the dense one embeds the corpus, minutes, when it is not cached) and
#: the built-in SWE repository (the others are fetched).
CHEAP = {"VT-Search-v0": {"retriever": "bm25"}, "VT-Multi-v0": {"retriever": "bm25"},
         "VT-SWE-v0": {"repos": ["vtutils"]}}  # fmt: skip


def test_the_committed_page_is_what_the_code_generates():
    out = subprocess.run(
        [sys.executable, "-m", "vt_envs.keyword_reference", "--out", REFERENCE_PAGE, "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning either


def test_check_names_the_command_when_the_page_is_stale(tmp_path):
    stale = tmp_path / "env-keywords.md"
    stale.write_text("# old\n")
    out = subprocess.run(
        [sys.executable, "-m", "vt_envs.keyword_reference", "--out", str(stale), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert COMMAND in out.stderr


@pytest.mark.parametrize("env_id", VT_IDS)
def test_every_accepted_keyword_is_listed_once_and_documented(env_id):
    found = keywords(env_id)
    names = [k.name for k in found]
    assert len(names) == len(set(names))
    assert set(names) == set(builder_of(env_id).accepted_kwargs)
    assert all(k.doc.strip() for k in found), [k.name for k in found if not k.doc.strip()]
    assert [k.scope for k in found] == sorted(
        (k.scope for k in found), key=["env", "common", "server"].index
    )
    assert "tool_server" in names and keywords(env_id)[-1].scope == "server"


@pytest.mark.parametrize("env_id", VT_IDS)
def test_the_documented_defaults_are_what_gym_make_uses(env_id):
    documented = {k.name: k.default for k in keywords(env_id) if k.scope == "common"}
    env = gym.make(env_id, **CHEAP.get(env_id, {}))
    try:
        built = env.unwrapped
        checked = {n: documented[n] for n in STORED if n in documented}
        assert len(checked) >= 5, sorted(documented)
        assert {n: getattr(built, n) for n in checked} == checked
    finally:
        env.close()


def test_the_notes_say_how_a_builder_treats_a_common_keyword():
    search = {k.name: k for k in keywords("VT-Search-v0")}
    assert "max_searches" in search["max_tool_calls"].note
    assert search["max_tool_calls"].default == search["max_searches"].default
    swe = {k.name: k for k in keywords("VT-SWE-v0")}
    assert swe["action_format"].default == "json" and "fixed" in swe["action_format"].note
    assert "eval_timeout_s" in swe["verify_timeout_s"].note


def test_an_unknown_id_is_refused_with_did_you_mean():
    with pytest.raises(UnknownNameError, match="Did you mean 'VT-SQL-v0'"):
        keywords("VT-SQl-v0")


@env_builder
def _make_undocumented(*, split: str = "train", secret_knob: int, **env_kwargs):
    """A builder for the test below.

    Args:
        split: documented.
    """
    raise AssertionError("never built")


@pytest.fixture
def undocumented_id(register_temporary):
    register_temporary("VTTest/Undocumented-v0", builder=_make_undocumented)
    return "VTTest/Undocumented-v0"


def test_an_undocumented_keyword_is_an_error_naming_it(undocumented_id):
    with pytest.raises(InvalidConfigError, match="documented nowhere: secret_knob") as caught:
        keywords(undocumented_id)
    assert "split" not in str(caught.value).split("nowhere:")[1]


def test_registration_kwargs_override_the_signature_and_no_default_is_required(
    register_temporary,
):
    env_id = "VTTest/Overridden-v0"

    @env_builder
    def build(*, split: str = "train", size: int, **env_kwargs):
        """A builder for this test.

        Args:
            split: which split.
            size: how many tasks.
        """

    register_temporary(env_id, builder=build, kwargs={"max_turns": 3})
    found = {k.name: k for k in keywords(env_id)}
    assert found["max_turns"].default == 3 and found["split"].default == "train"
    assert found["size"].default is REQUIRED and found["size"].annotation == "int"
