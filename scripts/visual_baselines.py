"""VT-Visual-v0's oracle, no-tool and options-only shortcut over every held-out task, by kind.

    python scripts/visual_baselines.py [--fit 2000]

Fits :class:`~vt_envs.domains.visual.shortcuts.ShortcutPolicy` on the first
``--fit`` train tasks (for each kind, the option statistic that scores best
from the prompts alone), then plays the oracle, the no-tool baseline (always
(A)) and that shortcut on all 200 test tasks through ``gym.make`` and prints
the mean reward of each by kind, with the fitted table, as JSON. These are
docs/envs/visual.md's VT-Visual-v0 numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import gymnasium as gym

import vt_envs
from vt_envs.domains.visual import ChoiceMatch, NoToolPolicy, visual_tasks
from vt_envs.domains.visual.shortcuts import ShortcutPolicy, fit_shortcut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=int, default=4000, help="train tasks to fit the shortcut on")
    args = parser.parse_args()
    start = time.perf_counter()
    fitted = fit_shortcut(visual_tasks("train", size=args.fit), ChoiceMatch())
    table = {kind: statistic for kind, (statistic, _) in fitted.items()}
    env = gym.make("VT-Visual-v0", split="test")
    policies = {
        "oracle": vt_envs.oracle_for("VT-Visual-v0"),
        "no_tool": NoToolPolicy(),
        "shortcut": ShortcutPolicy(table),
    }
    rewards = {name: collections.defaultdict(list) for name in policies}
    for task in env.unwrapped.tasks:
        for name, policy in policies.items():
            result = vt_envs.run_episode(env, policy, options={"task_id": task.id})
            rewards[name][task.metadata["kind"]].append(result.reward)
    env.close()
    report: dict[str, object] = {"shortcut_fit_on_train": fitted}
    for name, by_kind in rewards.items():
        everything = [r for values in by_kind.values() for r in values]
        report[name] = {
            **{kind: round(sum(v) / len(v), 3) for kind, v in by_kind.items()},
            "all": round(sum(everything) / len(everything), 3),
            "tasks": len(everything),
        }
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
