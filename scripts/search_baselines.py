"""VT-Search-v0's oracle and no-search baseline over every held-out task, per retriever.

    python scripts/search_baselines.py

Prints, for the dense and the BM25 retriever, the mean reward of
:class:`~vt_envs.domains.search.SearchOracle` and of
:class:`~vt_envs.domains.search.NoSearchPolicy` by task kind (with the task
counts), whether both retrievers played the same task ids, and the shipped
closed-book check's figures (``scripts/search_closed_book.py``), as JSON.
These are docs/envs/search.md's oracle and baseline numbers.
"""

from __future__ import annotations

import collections
import json
import time
from importlib import resources

import vt_envs
from vt_envs.domains.search import NoSearchPolicy
from vt_envs.domains.search.tasks import CLOSED_BOOK_FILE


def evaluate(retriever: str) -> dict[str, object]:
    env = vt_envs.make("VT-Search-v0", retriever=retriever, split="test")
    ids = [task.id for task in env.tasks]
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
    report: dict[str, object] = {"seconds": round(time.perf_counter() - start, 1), "ids": ids}
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


def closed_book() -> dict[str, object]:
    path = resources.files("vt_envs") / "assets" / "search" / CLOSED_BOOK_FILE
    if not path.is_file():
        return {"not computed": "python scripts/search_closed_book.py"}
    test = json.loads(path.read_text())["splits"]["test"]
    return {"answered (dropped)": len(test["answered"]), **test["accuracy"]}


if __name__ == "__main__":
    reports = {r: evaluate(r) for r in ("dense", "bm25")}
    same = reports["dense"].pop("ids") == reports["bm25"].pop("ids")
    print(json.dumps({**reports, "same_task_ids": same, "closed_book": closed_book()}, indent=1))
