"""Registration: ids, gym.make forms, and developer-error messages (pinned)."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.errors import UnknownKwargError, UnknownNameError

EXPECTED_IDS = {"VT-Lookup-v0", "VT-Math-v0", "VT-SQL-v0", "VT-Search-v0"}


def test_import_registers_every_vt_id():
    assert set(vt_envs.registered_envs()) >= EXPECTED_IDS
    for env_id in vt_envs.registered_envs():
        assert env_id in gym.registry


def test_module_prefixed_id_works_in_a_fresh_interpreter():
    code = (
        "import gymnasium as gym\n"
        "env = gym.make('vt_envs:VT-Lookup-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(info['task_id'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("lookup/train/")


def test_unknown_kwarg_says_did_you_mean_and_lists_accepted():
    with pytest.raises(UnknownKwargError) as err:
        gym.make("VT-Lookup-v0", max_turn=3)
    message = str(err.value)
    assert "got an unexpected keyword argument 'max_turn'. Did you mean 'max_turns'?" in message
    assert "Accepted keywords:" in message and "tokenizer" in message
    assert isinstance(err.value, TypeError)  # still a TypeError for generic handlers


def test_unknown_id_gymnasium_and_vt_make():
    with pytest.raises(gym.error.NameNotFound, match="Did you mean: `VT-Lookup`"):
        gym.make("VT-Lookp-v0")
    with pytest.raises(UnknownNameError) as err:
        vt_envs.make("VT-Lookp-v0")
    assert "Unknown env id 'VT-Lookp-v0'. Did you mean 'VT-Lookup-v0'?" in str(err.value)
    assert "vt_envs.registered_envs()" in str(err.value)


def test_wrong_version_names_the_existing_one():
    with pytest.raises(gym.error.VersionNotFound, match="v0"):
        gym.make("VT-Lookup-v9")


def test_vt_make_returns_the_raw_env_with_spec():
    env = vt_envs.make("VT-Lookup-v0", max_turns=2)
    assert isinstance(env, vt_envs.ToolEnv) and env.spec.id == "VT-Lookup-v0"
    assert env.max_turns == 2


def _first_prompt(env) -> str:
    return env.reset(seed=3)[0]["text"]


@pytest.mark.parametrize("maker", ["gym.make", "vt_envs.make", "make_vec"])
def test_the_spec_rebuilds_the_same_env(maker):
    kwargs = {"max_turns": 3, "num_keys": 4, "observation_format": "inline"}
    if maker == "gym.make":
        env = gym.make("VT-Lookup-v0", **kwargs)
    elif maker == "vt_envs.make":
        env = vt_envs.make("VT-Lookup-v0", **kwargs)
    else:
        env = vt_envs.make_vec("VT-Lookup-v0", num_envs=2, **kwargs).envs[1]
    assert {k: env.spec.kwargs[k] for k in kwargs} == kwargs
    for rebuilt in (gym.make(env.spec), vt_envs.make(env.spec)):
        raw = rebuilt.unwrapped
        assert (raw.max_turns, raw.observation_format) == (3, "inline")
        assert len(raw.tasks[0].assets["table"]) == 4
        assert _first_prompt(rebuilt) == _first_prompt(env)


def test_oracle_for_unknown_and_known():
    assert isinstance(vt_envs.oracle_for("VT-Lookup-v0"), vt_envs.OraclePolicy)
    with pytest.raises(UnknownNameError, match="Unknown env id"):
        vt_envs.oracle_for("VT-Nope-v0")


DEADLINE_KWARGS = [
    ("VT-Math-v0", "python_timeout_s"),
    ("VT-Math-v0", "verify_timeout_s"),
    ("VT-Math-v0", "max_episode_seconds"),
    ("VT-SQL-v0", "query_timeout_s"),
    ("VT-Search-v0", "search_timeout_s"),
    ("VT-Visual-v0", "tool_timeout_s"),
    ("VT-SWE-v0", "bash_timeout_s"),
    ("VT-SWE-v0", "eval_timeout_s"),
    ("VT-Multi-v0", "sql_timeout_s"),
]


@pytest.mark.parametrize("env_id,keyword", DEADLINE_KWARGS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0, "10", True], ids=repr)
def test_a_deadline_keyword_that_is_not_a_deadline_is_refused(env_id, keyword, value):
    """NaN, infinite, negative, zero or non-numeric deadlines raise at gym.make, naming the
    keyword, the value and the fix (a NaN one would break the shared loop's timer heap)."""
    from vt_envs.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError) as caught:
        gym.make(env_id, **{keyword: value}).close()
    message = str(caught.value)
    assert keyword in message and repr(value) in message and f"{keyword}=10.0" in message


@pytest.mark.parametrize(
    "env_id,keyword",
    [
        ("VT-SQL-v0", "query_timeout_s"),
        ("VT-SWE-v0", "eval_timeout_s"),
        ("VT-Math-v0", "verify_timeout_s"),
    ],
)
def test_the_longest_deadline_a_user_may_set_builds_the_env(env_id, keyword):
    """Deadlines a domain derives from it (SQL's verifier: twice the query's; SWE's
    verification: the hidden tests' + 30 s) are not refused for passing the cap."""
    from vt_envs.core.tool import MAX_TIMEOUT_S

    gym.make(env_id, **{keyword: MAX_TIMEOUT_S}).close()
