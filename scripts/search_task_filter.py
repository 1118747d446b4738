"""Recompute VT-Search-v0's shipped retrieval filter for the default corpus.

    python scripts/search_task_filter.py

Generates every candidate task of the embedded corpus, runs each hop's oracle
query through BOTH retrievers (BM25 and dense all-MiniLM-L6-v2, flat index;
the ``search`` extra is required) and writes the ids of those that either
retriever misses at rank > ``FILTER_K`` to ``vt_envs/assets/search/retrievable.json``,
with the generator version, the corpus hash and a digest of the candidates, so
the env uses it only for exactly these tasks. Rerun after changing the
generator (and bump ``GENERATOR_VERSION``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vt_envs.domains.search import dense_available, shared_retriever, vital_articles_corpus
from vt_envs.domains.search.tasks import (
    FILTER_K,
    GENERATOR_VERSION,
    RETRIEVAL_FILE,
    candidate_tasks,
    candidates_digest,
    retrievable,
)

OUT = Path(__file__).resolve().parent.parent / "vt_envs" / "assets" / "search" / RETRIEVAL_FILE


def main() -> None:
    if not dense_available():
        raise SystemExit('the dense retriever is needed: pip install -e ".[search]"')
    start = time.perf_counter()
    corpus = vital_articles_corpus()
    candidates = candidate_tasks(corpus)
    retrievers = [shared_retriever("bm25", corpus), shared_retriever("dense", corpus)]
    splits = {}
    for split in ("train", "test"):
        mine = [c for c in candidates if c.split == split]
        misses = {r.name: retrievable(mine, r, FILTER_K) for r in retrievers}
        dropped = [c for i, c in enumerate(mine) if not all(ok[i] for ok in misses.values())]
        splits[split] = {
            "candidates": len(mine),
            "candidates_digest": candidates_digest(mine),
            "missed_by": {name: ok.count(False) for name, ok in misses.items()},
            "dropped": sorted(c.id.removeprefix(f"search/{split}/") for c in dropped),
        }
        print(split, {k: v for k, v in splits[split].items() if k != "dropped"}, len(dropped))
    data = {
        "what": "VT-Search-v0 candidates a retriever misses (kind/key), per split",
        "generator_version": GENERATOR_VERSION,
        "corpus": corpus.content_hash,
        "k": FILTER_K,
        "retrievers": [r.name for r in retrievers],
        "splits": splits,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=0) + "\n")
    print(f"wrote {OUT} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
