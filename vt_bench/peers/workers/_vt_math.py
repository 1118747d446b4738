"""VT-Math-v0 on the comparison's questions, for the VT side of the math workers."""

from __future__ import annotations


def math_env(params):
    """``(env, problems)``: VT-Math-v0 through ``gym.make`` over ``params["problems"]``."""
    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)
    from vt_envs import Task, TaskList

    problems = params["problems"]
    tasks = TaskList([Task(p["id"], p["question"], p["answer"]) for p in problems], name="peers")
    return gym.make("VT-Math-v0", dataset=tasks), problems
