"""GEM side of the answer-only episode comparison: MathEnv on the same questions."""

from __future__ import annotations

from _loop import serve


def setup(params):
    from datasets import Dataset
    from gem.envs.math_env import MathEnv

    problems = params["problems"]
    dataset = Dataset.from_list([{"problem": p["question"], "answer": p["answer"]}
                                 for p in problems])  # fmt: skip
    return MathEnv(dataset=dataset, eval=True), problems


def run(state, n):
    env, problems = state
    reward_sum = 0.0
    for i in range(n):
        problem = problems[i % len(problems)]
        env.reset(idx=i % len(problems))
        _, reward, *_ = env.step(f"The answer is \\boxed{{{problem['answer']}}}.")
        reward_sum += float(reward)
    return n, reward_sum


if __name__ == "__main__":
    serve(setup, run)
