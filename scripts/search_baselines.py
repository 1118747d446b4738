"""VT-Search-v0's oracle and no-search baseline over every held-out task, per retriever.

    python scripts/search_baselines.py

Prints, for the dense and the BM25 retriever, the mean reward of
:class:`~vt_envs.domains.search.SearchOracle` and of
:class:`~vt_envs.domains.search.NoSearchPolicy` by task kind (with the task
counts) as JSON. These are the README's oracle and baseline numbers.
"""

from __future__ import annotations

import collections
import json
import time

import vt_envs
from vt_envs.domains.search import NoSearchPolicy


def evaluate(retriever: str) -> dict[str, object]:
    env = vt_envs.make("VT-Search-v0", retriever=retriever, split="test")
    rewards: dict[str, dict[str, list[float]]] = {
        "oracle": collections.defaultdict(list),
        "no_search": collections.defaultdict(list),
    }
    start = time.perf_counter()
    for task in env.tasks:
        policies = {"oracle": vt_envs.oracle_for("VT-Search-v0"), "no_search": NoSearchPolicy()}
        for name, policy in policies.items():
            result = vt_envs.run_episode(env, policy, options={"task_id": task.id})
            rewards[name][task.metadata["kind"]].append(result.reward)
    env.close()
    report: dict[str, object] = {"seconds": round(time.perf_counter() - start, 1)}
    for name, by_kind in rewards.items():
        everything = [r for values in by_kind.values() for r in values]
        report[name] = {
            **{
                kind: {"tasks": len(v), "mean": round(sum(v) / len(v), 4)}
                for kind, v in by_kind.items()
            },
            "all": round(sum(everything) / len(everything), 4),
        }
    return report


if __name__ == "__main__":
    print(json.dumps({r: evaluate(r) for r in ("dense", "bm25")}, indent=1))
