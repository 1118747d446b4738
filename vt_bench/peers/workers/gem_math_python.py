"""GEM side of the one-call episode comparison: MathEnv wrapped with its Python tool
(``ToolEnvWrapper(MathEnv, [PythonCodeTool])``): reset, one ``<python>`` call that prints
the answer, then the answer."""

from __future__ import annotations

from _loop import serve


def setup(params):
    from datasets import Dataset
    from gem.envs.math_env import MathEnv
    from gem.tools.python_code_tool import PythonCodeTool
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    problems = params["problems"]
    dataset = Dataset.from_list([{"problem": p["question"], "answer": p["answer"]}
                                 for p in problems])  # fmt: skip
    env = ToolEnvWrapper(MathEnv(dataset=dataset, eval=True), tools=[PythonCodeTool(timeout=10)])
    return env, problems


def run(state, n):
    env, _ = state
    reward_sum = 0.0
    for _ in range(n):
        env.reset()  # the wrapper takes no idx: answer the question MathEnv drew
        answer = str(env.env.answer)
        obs, *_ = env.step(f"<python>print({answer!r})</python>")
        assert answer in obs, obs
        _, reward, *_ = env.step(f"The answer is \\boxed{{{answer}}}.")
        reward_sum += float(reward)
    return n, reward_sum


if __name__ == "__main__":
    serve(setup, run)
