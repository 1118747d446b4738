"""SkyRL-gym side of the SQL comparison: its text2sql env on the same SQLite file and
queries (a new env per episode, as SkyRL-gym runs them; one query, then the solution)."""

from __future__ import annotations

import json
from pathlib import Path

from _loop import serve


def setup(params):
    from omegaconf import DictConfig
    from skyrl_gym.envs.sql.env import SQLEnv

    queries = [r["query"] for r in json.loads(Path(params["questions"]).read_text())]
    return SQLEnv, DictConfig({"db_path": params["db_root"]}), queries


def run(state, n):
    SQLEnv, config, queries = state
    steps, reward_sum = 0, 0.0
    for i in range(n):
        gold = queries[i % len(queries)]
        extras = {"db_id": "shop", "reward_spec": {"ground_truth": gold}, "data": "spider",
                  "max_turns": 5}  # fmt: skip
        env = SQLEnv(config, extras)
        env.init([{"role": "user", "content": "Query"}])
        # SkyRL-gym's format reward wants a <think> block before each call and the solution.
        env.step(f"<think>look</think><sql>{gold}</sql>")
        out = env.step(f"<think>done</think><solution>{gold}</solution>")
        env.close()
        steps, reward_sum = steps + 2, reward_sum + float(out["reward"])
    return steps, reward_sum


if __name__ == "__main__":
    serve(setup, run)
