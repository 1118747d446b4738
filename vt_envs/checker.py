"""``vt_envs.check(ID)`` / ``vt-envs check ID``: is an env id sound as a benchmark?

Runs, through ``gym.make`` as a user would:

- ``check_env``: Gymnasium's own checker (spaces, reset/step contract, its
  determinism checks), with the env's render modes;
- ``determinism``: two fresh envs play the same seeded oracle episodes and
  return the same task ids, actions, observations, token ids and rewards;
  different seeds draw different tasks;
- ``oracle``: the registered oracle scores 1.0 on ``episodes`` seeded tasks;
- ``junk actions``: malformed actions (empty, unclosed tags, bad JSON, binary
  noise, 50k characters) are observations, never exceptions, and the episode
  still ends within its budgets;
- ``no-tool baseline`` and each registered shortcut: their mean reward, which
  fails the check if it equals the oracle's (the tools, or the task, are not
  needed) and warns above 0.5.

Each check returns PASS, WARN or FAIL with a one-line detail; the command exits
1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CheckResult", "check", "main"]

JUNK_ACTIONS = (
    "",
    "<answer>",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "\x00\x01\xff" * 10,
    "x" * 50_000,
)


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict (``"PASS"``, ``"WARN"`` or ``"FAIL"``) and what it saw."""

    name: str
    verdict: str
    detail: str
    seconds: float

    def line(self) -> str:
        return f"{self.verdict:4}  {self.name:<22} {self.detail} ({self.seconds:.1f} s)"


def _timed(name: str, run: Callable[[], tuple[str, str]]) -> CheckResult:
    start = time.perf_counter()
    try:
        verdict, detail = run()
    except Exception as error:  # a crash is the finding
        verdict, detail = "FAIL", f"raised {type(error).__name__}: {' '.join(str(error).split())}"
    return CheckResult(name, verdict, detail[:500], time.perf_counter() - start)


def check(
    env_id: str,
    *,
    episodes: int = 5,
    split: str = "test",
    env_kwargs: Mapping[str, Any] | None = None,
) -> list[CheckResult]:
    """Run every check on ``env_id`` (see the module docstring)."""
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import vt_envs
    from vt_envs.registration import registration_of

    kwargs = {"split": split, **dict(env_kwargs or {})}
    registration = registration_of(env_id)

    def make(**extra: Any) -> Any:
        return gym.make(env_id, **kwargs, **extra)

    def play(policy_factory: Callable[[Any], Any], seeds: Sequence[int]) -> list[Any]:
        env = make()
        try:
            return [vt_envs.run_episode(env, policy_factory(env), seed=s) for s in seeds]
        finally:
            env.close()

    def run_check_env() -> tuple[str, str]:
        probe = make()
        modes = list(probe.metadata.get("render_modes", []))
        probe.close()
        env = make(render_mode="ansi") if "ansi" in modes else make()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                check_env(env, skip_render_check="ansi" not in modes)
        finally:
            env.close()
        odd = [
            str(w.message) for w in caught if "different from the unwrapped" not in str(w.message)
        ]
        if odd:
            return "FAIL", f"{len(odd)} warning(s): {odd[0]}"
        return "PASS", f"spaces and reset/step contract hold (render modes {modes})"

    def oracle(env: Any) -> Any:
        return vt_envs.oracle_for(env_id)

    def run_determinism() -> tuple[str, str]:
        def rollout() -> list[tuple]:
            return [(r.task_id, r.reward, r.actions, r.observations, r.tokens)
                    for r in play(oracle, (11, 12))]  # fmt: skip

        first, second = rollout(), rollout()
        if first != second:
            return "FAIL", "the same seeds gave different episodes in two fresh envs"
        if first[0][0] == first[1][0]:
            return "WARN", "seeds 11 and 12 drew the same task"
        return "PASS", "same seeds, same episodes (ids, observations, tokens, rewards)"

    oracle_mean: list[float] = []

    def run_oracle() -> tuple[str, str]:
        results = play(oracle, range(episodes))
        rewards = [r.reward for r in results]
        oracle_mean.append(sum(rewards) / len(rewards))
        bad = [r.task_id for r in results if r.reward != 1.0 or not r.terminated]
        if bad:
            return "FAIL", f"{len(bad)} of {episodes} tasks not solved, e.g. {bad[0]}"
        return "PASS", f"{episodes} of {episodes} tasks solved through the tools"

    def run_junk() -> tuple[str, str]:
        env = make()
        try:
            env.reset(seed=0)
            steps, done = 0, False
            while not done:
                action = JUNK_ACTIONS[steps % len(JUNK_ACTIONS)]
                _, reward, terminated, truncated, info = env.step(action)
                steps += 1
                done = terminated or truncated
                if steps > 1000:
                    return "FAIL", "1,000 junk actions and the episode has not ended"
        finally:
            env.close()
        return (
            "PASS",
            f"{steps} junk actions were observations; the episode ended (reward {reward})",
        )

    def scored(name: str, factory: Callable[[Any], Any]) -> Callable[[], tuple[str, str]]:
        def run() -> tuple[str, str]:
            rewards = [r.reward for r in play(factory, range(episodes))]
            mean = sum(rewards) / len(rewards)
            ceiling = oracle_mean[0] if oracle_mean else 1.0
            text = f"mean reward {mean:.3f} on {episodes} tasks (oracle {ceiling:.3f})"
            if mean >= ceiling > 0:
                return "FAIL", text + ": as good as the oracle without doing the task"
            return ("WARN" if mean > 0.5 else "PASS"), text

        return run

    results = [
        _timed("check_env", run_check_env),
        _timed("determinism", run_determinism),
        _timed("oracle", run_oracle),
        _timed("junk actions", run_junk),
        _timed(
            "no-tool baseline", scored("no-tool", lambda env: vt_envs.baseline_for(env_id, env))
        ),
    ]
    for name in registration.shortcuts:
        results.append(
            _timed(
                f"shortcut {name}",
                scored(name, lambda env, n=name: vt_envs.shortcut_for(env_id, n, env.unwrapped)),
            )
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``vt-envs check ID [...]``: print each check's verdict; 1 if any failed."""
    from vt_envs.core.plugins import add_import_argument, import_plugins

    parser = argparse.ArgumentParser(prog="vt-envs", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    checker = sub.add_parser("check", help="check an env id as a benchmark")
    checker.add_argument("env_id")
    checker.add_argument("--episodes", type=int, default=5, help="oracle/baseline episodes")
    checker.add_argument("--split", default="test")
    checker.add_argument("--env-kwargs", default="{}", help="make() keywords, a JSON object")
    add_import_argument(checker, "the env id")
    args = parser.parse_args(argv)
    import_plugins(args.imports)
    from vt_envs.errors import InvalidConfigError

    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(f"--env-kwargs is not a JSON object: {exc}") from exc
    results = check(args.env_id, episodes=args.episodes, split=args.split, env_kwargs=env_kwargs)
    for result in results:
        print(result.line())
    failed = [r.name for r in results if r.verdict == "FAIL"]
    print(f"{args.env_id}: " + (f"FAILED ({', '.join(failed)})" if failed else "sound"))
    return 1 if failed else 0


def _console() -> Callable[[], None]:
    from vt_envs.errors import console_main

    return console_main("vt-envs", main)


#: The ``vt-envs`` console script: user errors in one line, exit 2.
console = _console()

if __name__ == "__main__":
    console()
