"""Mixed-domain envs: draws follow the weights, episodes run in the right member, the
vector env and its spaces hold across domains."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import vt_envs
from vt_envs.core.policy import run_episode
from vt_envs.core.task import Task, TaskList
from vt_envs.errors import InvalidConfigError, UnknownTaskError
from vt_envs.vector.mixture import MixturePolicy, MixtureTasks, parse_mixture_id


def _source(name: str, n: int) -> TaskList:
    return TaskList([Task(id=f"{name}/{i}", prompt=f"{name} {i}") for i in range(n)], name=name)


def test_draws_follow_the_weights_with_the_seed():
    weights = {"A": 0.5, "B": 0.3, "C": 0.2}
    sources = {k: _source(k, 1000) for k in weights}
    tasks = MixtureTasks(sources, weights, size=20_000, seed=3)
    counts = tasks.counts()
    for name, w in weights.items():  # binomial: within 4 standard deviations
        sd = math.sqrt(20_000 * w * (1 - w))
        assert abs(counts[name] - 20_000 * w) < 4 * sd, counts
    # the trainer samples indices uniformly: its draws follow the weights too
    rng = np.random.default_rng(0)
    drawn = [tasks[int(i)].metadata["env_id"] for i in rng.integers(len(tasks), size=5000)]
    assert abs(drawn.count("A") / 5000 - 0.5) < 0.04
    assert MixtureTasks(sources, weights, size=500, seed=3).counts() == tasks.counts(500)
    assert MixtureTasks(sources, weights, size=500, seed=4).counts() != tasks.counts(500)


def test_a_prefix_holds_distinct_tasks_of_each_domain_and_ids_route_back():
    sources = {"A": _source("A", 50), "B": _source("B", 50)}
    tasks = MixtureTasks(sources, {"A": 1, "B": 3}, size=80, seed=0)
    first = [tasks[i] for i in range(60)]
    assert len({t.id for t in first}) == 60
    assert all(t.id.startswith(t.metadata["env_id"] + "/") for t in first)
    for t in first[:10]:
        assert tasks.get(t.id) == t
    with pytest.raises(UnknownTaskError):
        tasks.get("C/A/0")
    zero = MixtureTasks(sources, {"A": 1, "B": 0}, size=100)
    assert zero.counts() == {"A": 100, "B": 0}


@pytest.mark.parametrize(
    "weights",
    [{}, {"A": -1.0}, {"A": 0, "B": 0}, {"A": float("nan")}, ["A"]],
)
def test_bad_weights_are_typed_errors(weights):
    with pytest.raises(InvalidConfigError, match=r"weight|mapping"):
        MixtureTasks({"A": _source("A", 2), "B": _source("B", 2)}, weights)


@pytest.fixture(scope="module")
def mixture():
    env = vt_envs.make_mixture({"VT-Math-v0": 0.5, "VT-Lookup-v0": 0.5}, max_turns=4)
    yield env
    env.close()


def test_every_episode_runs_in_its_member_and_the_oracles_solve_each_domain(mixture):
    seen = set()
    policy = MixturePolicy(vt_envs.oracle_for)  # one policy for every episode, any domain
    for seed in range(8):
        obs, info = mixture.reset(seed=seed)
        env_id = info["env_id"]
        seen.add(env_id)
        assert info["task_id"].startswith(env_id + "/")
        assert mixture.observation_space.contains(obs)
        policy.reset(mixture.task)
        while True:
            obs, reward, terminated, truncated, info = mixture.step(policy.act(obs["text"], info))
            assert info["env_id"] == env_id
            if terminated or truncated:
                break
        assert reward == 1.0
    assert seen == {"VT-Math-v0", "VT-Lookup-v0"}
    assert set(mixture.stop_strings) >= {"</python>", "</lookup>", "</answer>"}


def test_reset_by_mixture_id_or_task_and_seeded_determinism(mixture):
    _, info = mixture.reset(seed=5)
    task_id = info["task_id"]
    obs_a, info_a = mixture.reset(options={"task_id": task_id})
    assert info_a["task_id"] == task_id
    obs_b, _ = mixture.reset(options={"task": mixture.tasks.get(task_id)})
    assert obs_a["text"] == obs_b["text"]
    again = [mixture.reset(seed=s)[1]["task_id"] for s in (1, 2, 3)]
    assert again == [mixture.reset(seed=s)[1]["task_id"] for s in (1, 2, 3)]
    with pytest.raises(InvalidConfigError, match="task of this mixture"):
        mixture.reset(options={"task": Task(id="x", prompt="?")})


def test_vector_mixture_through_the_batch_api_uses_one_tokenizer():
    tok = vt_envs.load_tokenizer()
    venv = vt_envs.make_vec_mixture(
        {"VT-Math-v0": 1, "VT-Lookup-v0": 1},
        3,
        tokenizer=tok,
        env_kwargs={"VT-Lookup-v0": {"num_keys": 4}},
    )
    try:
        obs, info = venv.reset(seed=0)
        assert len(obs["tokens"]) == 3 and set(info["env_id"]) <= {"VT-Math-v0", "VT-Lookup-v0"}
        for env in venv.envs:
            assert all(m.unwrapped.tokenizer is tok for m in env.members.values())
        lookup = venv.envs[0].members["VT-Lookup-v0"].unwrapped
        assert len(lookup.tasks[0].assets["table"]) == 4  # that member's own keywords
        obs, reward, terminated, truncated, info = venv.step(["<answer>0</answer>"] * 3)
        assert terminated.all()
    finally:
        venv.close()
    with pytest.raises(InvalidConfigError, match="not in the mixture"):
        vt_envs.make_mixture({"VT-Lookup-v0": 1}, env_kwargs={"VT-Math-v0": {}})


def test_a_text_member_gets_an_empty_image_sequence_beside_an_image_member():
    env = vt_envs.make_mixture({"VT-Visual-v0": 1, "VT-Lookup-v0": 1})
    try:
        assert "images" in env.observation_space.spaces
        kinds = set()
        for seed in range(6):
            obs, info = env.reset(seed=seed)
            assert env.observation_space.contains(obs)
            kinds.add((info["env_id"], len(obs["images"]) > 0))
        assert kinds == {("VT-Visual-v0", True), ("VT-Lookup-v0", False)}
    finally:
        env.close()


def test_run_episode_and_gym_wrappers_see_the_mixture_as_an_env(mixture):
    result = run_episode(
        mixture,
        vt_envs.oracle_for("VT-Lookup-v0"),
        options={
            "task_id": next(
                mixture.tasks[i].id
                for i in range(50)
                if mixture.tasks[i].metadata["env_id"] == "VT-Lookup-v0"
            )
        },
    )
    assert result.reward == 1.0
    assert isinstance(mixture, gym.Env)


def test_mixture_ids_parse_with_and_without_weights():
    assert parse_mixture_id("VT-Math-v0") is None
    assert parse_mixture_id("mixture:VT-Math-v0=3,VT-SQL-v0=1") == {
        "VT-Math-v0": 0.75,
        "VT-SQL-v0": 0.25,
    }
    assert parse_mixture_id("mixture:A,B") == {"A": 0.5, "B": 0.5}
    with pytest.raises(InvalidConfigError, match="not a number"):
        parse_mixture_id("mixture:A=x")


def test_switching_domains_ends_the_last_members_episode_and_its_sandbox(mixture):
    math_task = next(
        mixture.tasks[i] for i in range(50) if mixture.tasks[i].metadata["env_id"] == "VT-Math-v0"
    )
    lookup_task = next(
        mixture.tasks[i] for i in range(50) if mixture.tasks[i].metadata["env_id"] == "VT-Lookup-v0"
    )
    mixture.reset(options={"task_id": math_task.id})
    mixture.step("<python>print(1)</python>")  # the Math member's sandbox is running
    math = mixture.members["VT-Math-v0"].unwrapped
    process = math._live.sessions["python"].process
    assert process is not None and process.alive
    pool = math.tools["python"]._pool
    assert process not in pool._ready  # the episode holds it
    mixture.reset(options={"task_id": lookup_task.id})
    # the Math episode ended: its session closed, its sandbox recycled for the next one
    assert math._live.sessions == {} and process in pool._ready


def test_render_modes_are_the_members_common_ones():
    both = vt_envs.make_mixture({"VT-Visual-v0": 1, "VT-Lookup-v0": 1})
    visual = vt_envs.make_mixture({"VT-Visual-v0": 1}, render_mode="rgb_array")
    try:
        assert both.metadata["render_modes"] == ["ansi"]
        assert visual.metadata["render_modes"] == ["ansi", "rgb_array"]
        visual.reset(seed=0)
        assert visual.render().ndim == 3
    finally:
        both.close()
        visual.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"env_kwargs": {"VT-Lookup-v0": {"split": "test"}}},
        {"env_kwargs": {"VT-Lookup-v0": {"tokenizer": None}}},
    ],
)
def test_the_mixtures_own_keywords_are_refused_per_member(kwargs):
    with pytest.raises(InvalidConfigError, match="mixture's own"):
        vt_envs.make_mixture({"VT-Lookup-v0": 1}, **kwargs)


@pytest.mark.parametrize("spec", ["mixture:", "mixture:A=1,A=3", "mixture:A,,B"])
def test_empty_or_repeated_mixture_ids_are_refused(spec):
    with pytest.raises(InvalidConfigError, match=r"empty|repeated"):
        parse_mixture_id(spec)
