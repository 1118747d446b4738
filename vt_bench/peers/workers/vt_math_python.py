"""VT side of the one-call episode comparison: VT-Math-v0, reset, one sandboxed
``<python>`` call that prints the answer, then the answer."""

from __future__ import annotations

from _loop import serve


def setup(params):
    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)
    from vt_envs import Task, TaskList

    problems = params["problems"]
    tasks = TaskList([Task(p["id"], p["question"], p["answer"]) for p in problems], name="peers")
    env = gym.make("VT-Math-v0", dataset=tasks)
    return env, problems


def run(state, n):
    env, problems = state
    reward_sum = 0.0
    for i in range(n):
        problem = problems[i % len(problems)]
        env.reset(options={"task_id": problem["id"]})
        _, _, _, _, info = env.step(f"<python>print({problem['answer']!r})</python>")
        assert problem["answer"] in info["message"]["content"], info["message"]
        _, reward, *_ = env.step(f"The answer is \\boxed{{{problem['answer']}}}.")
        reward_sum += reward
    return n, reward_sum


if __name__ == "__main__":
    serve(setup, run)
