"""A scripted tour of the registered envs: ``python -m vt_envs.demo``.

For each env id, its oracle policy plays a few episodes on the held-out
split; the demo prints one full transcript (exactly the token stream a policy
would see, decoded) and a summary table: reward, turns, tool calls, and env
steps per second. Nothing is downloaded; no GPU or torch is needed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import gymnasium as gym

import vt_envs


def _run(env_id: str, episodes: int, seed: int) -> dict[str, float]:
    env = gym.make(env_id, split="test")
    oracle = vt_envs.oracle_for(env_id)
    start = time.perf_counter()
    results = [vt_envs.run_episode(env, oracle, seed=seed + i) for i in range(episodes)]
    elapsed = time.perf_counter() - start
    env.close()
    steps = sum(r.turns for r in results)
    return {
        "reward": statistics.mean(r.reward for r in results),
        "turns": steps / episodes,
        "tool_calls": statistics.mean(r.infos[-1]["tool_calls"] for r in results),
        "steps_per_s": steps / elapsed,
    }


def _transcript(env_id: str, seed: int) -> str:
    env = gym.make(env_id, split="test", render_mode="ansi")
    vt_envs.run_episode(env, vt_envs.oracle_for(env_id), seed=seed)
    text = env.render()
    env.close()
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5, help="oracle episodes per env")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", action="append", help="env id(s) to run (default: all)")
    args = parser.parse_args(argv)
    env_ids = args.env or sorted(vt_envs.registered_envs())

    print(f"== Transcript: {env_ids[0]} (oracle policy, seed {args.seed}) ==")
    print(_transcript(env_ids[0], args.seed))
    print()
    print(f"== Oracle summary ({args.episodes} held-out episodes per env) ==")
    print(f"| {'env id':<16} | reward | turns | tool calls | env steps/s |")
    print(f"|{'-' * 18}|--------|-------|------------|-------------|")
    ok = True
    for env_id in env_ids:
        row = _run(env_id, args.episodes, args.seed)
        ok &= row["reward"] == 1.0
        print(
            f"| {env_id:<16} | {row['reward']:6.2f} | {row['turns']:5.1f} | "
            f"{row['tool_calls']:10.1f} | {row['steps_per_s']:11.1f} |"
        )
    print()
    print("Every oracle solved its tasks." if ok else "Some oracle did NOT reach reward 1.0!")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
