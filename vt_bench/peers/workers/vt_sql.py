"""VT side of the SQL comparison: VT-SQL-v0 episodes (reset, one query, the answer)."""

from __future__ import annotations

from _loop import serve


def setup(params):
    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)

    files = {"questions": params["questions"], "database_dir": params["database_dir"]}
    env = gym.make("VT-SQL-v0", spider_files=files, split="test")
    tasks = env.unwrapped.tasks
    return env, [(tasks[i].id, tasks[i].gold) for i in range(len(tasks))]


def run(state, n):
    env, tasks = state
    steps, reward_sum = 0, 0.0
    for i in range(n):
        task_id, gold = tasks[i % len(tasks)]
        env.reset(options={"task_id": task_id})
        env.step(f"<sql>{gold}</sql>")
        _, reward, *_ = env.step(f"<answer>{gold}</answer>")
        steps, reward_sum = steps + 2, reward_sum + reward
    return steps, reward_sum


if __name__ == "__main__":
    serve(setup, run)
