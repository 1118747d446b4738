"""VT-Math-v0 starts an episode's sandbox at its first Python call: an episode that answers
at once costs no sandbox, and one that calls Python plays exactly as with a sandbox started
at reset (same seeded randomness, same state across calls)."""

from __future__ import annotations

import time

import gymnasium as gym
from env_helpers import sandbox_processes

import vt_envs  # noqa: F401  (registers the ids)


def test_an_answer_only_episode_starts_no_sandbox():
    env = gym.make("VT-Math-v0", split="test")
    before = sandbox_processes()
    for seed in range(3):
        env.reset(seed=seed)
        assert env.unwrapped._live.sessions["python"].process is None
        assert sandbox_processes() - before == set()
        *_, terminated, _, info = env.step("The answer is \\boxed{0}.")
        assert terminated
    assert sandbox_processes() - before == set()
    env.close()


def test_a_lazily_started_sandbox_plays_as_one_started_at_reset():
    code = "import random\nx = random.random()\nprint(x)"
    texts = {}
    for lazy in (True, False):
        env = gym.make("VT-Math-v0", split="test", lazy_start=lazy)
        env.reset(seed=7)
        started = env.unwrapped._live.sessions["python"].process is not None
        assert started is not lazy
        _, _, _, _, first = env.step(f"<python>{code}</python>")
        _, _, _, _, second = env.step("<python>print(x)</python>")  # state survives
        assert first["tool"]["ok"] and second["tool"]["ok"]
        texts[lazy] = env.unwrapped._transcript[-1]
        env.close()
    assert texts[True] == texts[False]


def test_closing_an_episode_that_never_called_leaves_nothing_running():
    env = gym.make("VT-Math-v0", split="test")
    before = sandbox_processes()
    env.reset(seed=0)
    env.close()
    time.sleep(0.2)
    assert sandbox_processes() - before == set()
