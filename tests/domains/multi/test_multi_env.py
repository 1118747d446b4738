"""VT-Multi-v0: every task needs a fact tool and Python, through gym.make; baselines low;
the held-out split shares no fact with the training split."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import vt_envs
from vt_envs.core.policy import run_episode
from vt_envs.domains.multi import FAMILIES, MultiFactsOnlyPolicy, MultiNoToolPolicy
from vt_envs.errors import InvalidConfigError


@pytest.fixture(scope="module")
def env():
    env = gym.make("VT-Multi-v0", split="test")
    yield env
    env.close()


def _tools_called(result) -> list[str]:
    return [info["tool"]["name"] for info in result.infos if "tool" in info]


def test_the_prompt_describes_all_three_tools_under_one_parser(env):
    prompt = env.unwrapped.system_prompt
    for call in ("<sql>QUERY</sql>", "<search>QUERY</search>", "<python>CODE</python>"):
        assert call in prompt
    assert '"name": "zoom"' in prompt and '"name": "crop"' in prompt
    assert {"</sql>", "</search>", "</python>", "</answer>"} <= set(env.unwrapped.stop_strings)


def test_the_oracle_needs_a_fact_tool_and_python_in_every_family(env):
    tasks = env.unwrapped.tasks
    for index in range(2 * len(FAMILIES)):
        task = tasks[index]
        result = run_episode(env, vt_envs.oracle_for("VT-Multi-v0"), options={"task_id": task.id})
        assert result.reward == 1.0, (task.id, result.actions)
        fact_tool = {"sql_lcm": "sql", "sql_product": "sql"}.get(
            task.metadata["family"], "search" if "search" in task.metadata["family"] else "zoom"
        )
        called = _tools_called(result)
        assert fact_tool in called and "python" in called
        assert set(task.metadata["tools"]) == {fact_tool, "python"}


def test_no_tool_and_facts_only_baselines_score_low(env):
    scores = {"none": [], "facts": []}
    for seed in range(30):
        scores["none"].append(run_episode(env, MultiNoToolPolicy(), seed=seed).reward)
        facts = run_episode(env, MultiFactsOnlyPolicy(), seed=seed)
        assert "python" not in _tools_called(facts)
        scores["facts"].append(facts.reward)
    assert sum(scores["none"]) == 0
    assert sum(scores["facts"]) / 30 <= 0.2


def test_no_held_out_fact_is_a_training_fact():
    train, test = (vt_envs.make("VT-Multi-v0", split=s) for s in ("train", "test"))
    try:

        def keys(tasks, n):
            out = set()
            for i in range(n):
                t = tasks[i]
                if t.metadata["family"] == "sql_lcm":
                    out.add(re.search(r"customer (\d+)", t.prompt).group(0))
                elif t.metadata["family"] == "sql_product":
                    out.add(
                        re.search(
                            r"a (\w+) product in the orders placed in ([\w ]+),", t.prompt
                        ).groups()
                    )
                elif t.metadata["family"] == "search_days":
                    out.update(re.findall(r'\(from "([^"]+)"\)', t.prompt))
            return out

        assert keys(train.tasks, 400).isdisjoint(keys(test.tasks, 300))
    finally:
        train.close()
        test.close()


def test_no_task_repeats_in_a_split(env):
    tasks = env.unwrapped.tasks
    seen = set()
    for i in range(len(tasks)):
        t = tasks[i]
        key = t.assets.get("number_scene", t.prompt)  # a crop task is its scene
        assert (t.metadata["family"], key) not in seen, t.id
        seen.add((t.metadata["family"], key))
    assert len(tasks) == 300


def test_sql_alone_cannot_finish_the_sql_families(env):
    """The one-tool attack: DuckDB's own LCM / product over the group overflows 128 bits."""
    tasks = env.unwrapped.tasks
    for family, reduce in (("sql_lcm", "lcm(a, b)"), ("sql_product", "a * b")):
        task = next(tasks[i] for i in range(len(tasks)) if tasks[i].metadata["family"] == family)
        query = (
            task.assets["oracle"]["query"]
            .replace(
                "SELECT i.unit_price",
                "SELECT list_reduce(list(CAST(round(i.unit_price * 100) AS HUGEINT)), "
                f"lambda a, b: {reduce})",
            )
            .replace(
                "SELECT i.quantity * i.unit_price",
                "SELECT list_reduce(list(CAST(round(i.quantity * i.unit_price * 100) AS HUGEINT)), "
                f"lambda a, b: {reduce})",
            )
        )
        env.reset(options={"task_id": task.id})
        _, _, _, _, info = env.step(f"<sql>{query}</sql>")
        assert not info["tool"]["ok"] and "out of range" in info["message"]["content"].lower()


def test_families_select_and_validate():
    env = vt_envs.make("VT-Multi-v0", families=["sql_lcm"], size=5)
    try:
        assert len(env.tasks) == 5
        assert {env.tasks[i].metadata["family"] for i in range(5)} == {"sql_lcm"}
    finally:
        env.close()
    with pytest.raises(InvalidConfigError, match="families"):
        vt_envs.make("VT-Multi-v0", families=["crop"])


def test_crop_tasks_show_one_image_with_both_tags_and_text_tasks_none(env):
    import numpy as np

    tasks = env.unwrapped.tasks
    for index in range(len(FAMILIES)):
        task = tasks[index]
        obs, _ = env.reset(options={"task_id": task.id})
        if task.metadata["family"] != "crop_product":
            assert obs["images"] == ()
            continue
        (image,) = obs["images"]
        width, height = task.assets["image_size"]
        assert image.shape == (height, width, 3)
        for left, top, right, bottom in task.assets["oracle"]["targets"]:
            tag = image[top:bottom, left:right]
            assert (tag == 255).all(axis=-1).mean() > 0.4  # a white tag ...
            assert (tag < 60).all(axis=-1).any()  # ... with black type and border
        assert int(task.gold) == np.prod(task.assets["oracle"]["numbers"])
