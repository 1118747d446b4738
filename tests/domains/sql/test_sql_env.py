"""VT-SQL-v0 end to end: determinism, the oracle, reminders, no gold leaks.

check_env runs for every id in tests/test_envs.py.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import vt_envs
import vt_envs.errors
from vt_envs.domains.sql import SQLOracle, make_sql_env
from vt_envs.errors import UnknownKwargError, UnknownNameError


@pytest.fixture
def env(sql_cache):
    env = make_sql_env(split="test")
    yield env
    env.close()


def test_prompt_shows_schema_keys_samples_and_question(env):
    obs, info = env.reset(options={"task_id": "sql/shop/test/0"})
    assert "<sql>QUERY</sql>" in obs["text"] and "<answer>ANSWER</answer>" in obs["text"]
    text = obs["text"].rsplit("<|im_start|>user", 1)[-1]  # the task (after the worked examples)
    assert "Database `shop`" in text
    assert "CREATE TABLE order_items (" in text
    assert "FOREIGN KEY (product_id) REFERENCES products(product_id)" in text
    assert text.count("; sample rows:") == 5
    assert "Question: For each product category, which product brought the most" in text
    assert info["task_id"] == "sql/shop/test/0"


def test_schema_sample_rows_is_configurable(sql_cache):
    env = make_sql_env(split="test", schema_sample_rows=0, databases=("tpch",))
    obs, _ = env.reset(seed=0)
    env.close()
    task = obs["text"].rsplit("<|im_start|>user", 1)[-1]
    assert "sample rows" not in task and "-- 15000 rows" in task


def test_ids_interleave_databases_and_name_the_same_question(sql_cache):
    both = make_sql_env(split="test", databases=("tpch", "shop"))
    shop = make_sql_env(split="test", databases=("shop",))
    try:
        assert [both.tasks[i].id for i in range(4)] == [
            "sql/tpch/test/0",
            "sql/shop/test/0",
            "sql/tpch/test/1",
            "sql/shop/test/1",
        ]
        assert both.tasks.get("sql/shop/test/1").prompt == shop.tasks[1].prompt
        assert len(both.tasks) == 200
    finally:
        both.close()
        shop.close()


def test_turn_reminder_and_tool_errors_are_observations(env):
    env.reset(options={"task_id": "sql/tpch/test/0"})
    obs, reward, terminated, truncated, info = env.step("<sql>SELECT COUNT(*) FROM region</sql>")
    assert "5\n(1 row)" in obs["text"] and obs["text"].rstrip().endswith(
        "(4 turns left)<|im_end|>\n<|im_start|>assistant"
    )
    assert info["tool"]["ok"] and (reward, terminated, truncated) == (0.0, False, False)
    obs, *_, info = env.step("<sql>DROP TABLE region</sql>")
    assert "not_read_only" in obs["text"] and "(3 turns left)" in obs["text"]
    assert info["tool"]["error"] == "not_read_only" and info["tool_errors"] == 1
    for _ in range(2):
        obs, *_ = env.step("<sql>SELECT 1</sql>")
    assert "(1 turn left)" in obs["text"]
    obs, reward, terminated, truncated, info = env.step("<sql>SELECT 1</sql>")
    assert (reward, terminated, truncated, info["truncation"]) == (0.0, False, True, "max_turns")


def test_wrong_answer_scores_zero(env):
    env.reset(options={"task_id": "sql/flights/test/0"})
    *_, reward, terminated, _, info = env.step("<answer>SELECT 1</answer>")
    assert (reward, terminated) == (0.0, True)
    assert info["reward_parts"] == {"outcome": 0.0}


def test_gold_never_reaches_observations_or_info(env):
    for task_id in ("sql/flights/test/3", "sql/tpch/test/3", "sql/shop/test/3"):
        result = vt_envs.run_episode(env, SQLOracle(), options={"task_id": task_id})
        gold = env.tasks.get(task_id).gold
        assert result.reward == 1.0
        assert all(gold not in text for text in result.observations)
        assert all(gold not in json.dumps(info, default=str) for info in result.infos)
        # the oracle's answer is the gold, and it appears only in its own action
        assert result.actions[-1] == f"<answer>{gold}</answer>"


def test_seeded_rollouts_are_deterministic(sql_cache):
    def rollout():
        env = make_sql_env(split="train")
        runs = [vt_envs.run_episode(env, SQLOracle(), seed=s) for s in (3, 4)]
        env.close()
        return [(r.task_id, r.reward, r.actions, r.observations, r.tokens) for r in runs]

    first = rollout()
    assert first == rollout()
    assert first[0][0] != first[1][0]


@pytest.mark.parametrize("split", ["train", "test"])
def test_oracle_solves_sampled_tasks(sql_cache, split):
    env = make_sql_env(split=split)
    indices = range(0, len(env.tasks), max(1, len(env.tasks) // 30))[:30]
    try:
        for index in indices:
            task_id = env.tasks[index].id
            result = vt_envs.run_episode(env, SQLOracle(), options={"task_id": task_id})
            assert (task_id, result.reward, result.turns) == (task_id, 1.0, 2)
    finally:
        env.close()


@pytest.mark.slow
def test_oracle_solves_the_whole_test_split(sql_cache):
    env = make_sql_env(split="test")
    try:
        for task in env.tasks:
            result = vt_envs.run_episode(env, SQLOracle(), options={"task_id": task.id})
            assert result.reward == 1.0, task.id
    finally:
        env.close()


def test_builder_errors_are_typed(sql_cache):
    with pytest.raises(UnknownKwargError, match="schema_sample_rows"):
        make_sql_env(schema_samples=2)
    with pytest.raises(UnknownNameError, match="tpch"):
        make_sql_env(databases=("tpc-h",))


@pytest.mark.skipif(
    "VT-SQL-v0" not in vt_envs.registered_envs(), reason="VT-SQL-v0 is not registered yet"
)
def test_gym_make(sql_cache):
    env = gym.make("VT-SQL-v0", split="test", max_turns=3)
    _, info = env.reset(seed=0)
    assert info["task_id"].startswith("sql/") and env.unwrapped.max_turns == 3
    env.close()


def test_task_ids_resolve_without_generating_the_split(sql_cache):
    env = make_sql_env(split="train")
    try:
        task = env.tasks.get("sql/tpch/train/9999")
        assert task.id == "sql/tpch/train/9999" and task is env.tasks[9999 * 3 + 1]
        assert len(env.tasks._cache) == 1
        with pytest.raises(vt_envs.errors.UnknownTaskError, match="sql/flights/train/0"):
            env.tasks.get("sql/tpch/test/1")
        with pytest.raises(vt_envs.errors.UnknownTaskError):
            env.tasks.get("sql/tpch/train/10000")
    finally:
        env.close()


# A coin the agent can flip with the tool: its result differs between executions.
COIN = "SELECT (random() < 0.5)::INTEGER AS heads"


def _coin_task(db_path) -> vt_envs.Task:
    return vt_envs.Task("coin", "Flip until heads.", gold="SELECT 1 AS heads",
                        assets={"db_path": str(db_path)})  # fmt: skip


def test_an_answer_the_episode_already_ran_is_graded_on_the_result_it_saw(db_paths):
    """Through gym.make: flip with the tool until it shows heads, then answer the same
    SQL. Graded on the result the agent saw, every episode scores 1.0; run again, the
    coin would come up tails about half the time."""
    env = gym.make("VT-SQL-v0", split="test", max_turns=40)
    task = _coin_task(db_paths["shop"])
    rewards = []
    for _ in range(16):
        env.reset(options={"task": task})
        while True:
            _, _, _, _, info = env.step(f"<sql>{COIN}</sql>")
            if info["message"]["content"].splitlines()[1].strip() == "1":
                break
        _, reward, terminated, _, info = env.step(f"<answer>{COIN}</answer>")
        assert terminated
        rewards.append(reward)
    env.close()
    assert rewards == [1.0] * 16


def test_a_new_episode_never_reuses_the_last_episodes_results(db_paths):
    """An episode that answers the coin SQL without running it gets a fresh flip, even
    right after an episode that saw heads for the same SQL on the same worker."""
    env = gym.make("VT-SQL-v0", split="test", max_turns=40)
    task = _coin_task(db_paths["shop"])
    rewards = []
    for _ in range(16):
        env.reset(options={"task": task})  # this episode sees heads ...
        while env.step(f"<sql>{COIN}</sql>")[4]["message"]["content"].splitlines()[1] != "1":
            pass
        env.step(f"<answer>{COIN}</answer>")
        env.reset(options={"task": task})  # ... the next one answers blind
        rewards.append(env.step(f"<answer>{COIN}</answer>")[1])
    env.close()
    assert 0.0 in rewards and 1.0 in rewards, rewards
