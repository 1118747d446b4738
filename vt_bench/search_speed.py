"""Search speed: VT-Search-v0 retrieval — index builds, queries/s and latency, recall.

Measured in one run, over the default corpus (the ~10k Wikipedia Vital
Article summaries) with the default embedder (all-MiniLM-L6-v2, 384-d, CPU):

- ``build``: the embedder's passages/s on ``--embed-sample`` passages (median
  over ``--repeats``) and the whole corpus's embedding time *extrapolated*
  from it, next to the build time the cache recorded when it embedded the
  corpus (if its meta file has one); the build time and file size of each
  FAISS index kind over the corpus embeddings (the ``scale`` row of the
  default corpus); the BM25 index's cold build (into a fresh cache directory)
  and size;
- ``queries``: end-to-end search (dense: encode + FAISS flat; BM25: tokenize
  + score) with the held-out tasks' oracle queries (``queries[0]``):
  ``search()`` one query at a time, ``asearch`` one at a time (through the
  micro-batcher, its window included), and ``--concurrency`` concurrent
  ``asearch`` calls (asyncio.gather, wave after wave), which the batcher
  merges; queries/s (median over ``--repeats``), per-query p50/p99 (pooled)
  and the batcher's mean batch size;
- ``scale``: FAISS alone (queries pre-encoded, so only the index's cost) over
  the default corpus and synthetic corpora of ``--sizes`` passages (real
  passage embeddings plus Gaussian noise of ``--noise`` per dimension,
  renormalized: clustered like real ones), for flat, HNSW and IVF: build
  time, file size, single-query p50/p99 (``--scale-queries`` queries, once),
  queries/s in batches of ``--batch`` (median over ``--repeats``), and
  recall@3/@10 of HNSW and IVF against flat's exact top-k. An HNSW build
  whose predicted time (n log n from the previous size) exceeds
  ``--hnsw-budget-s`` uses the smaller :data:`HNSW_FALLBACK` parameters; the
  parameters used are in the report;
- ``recall``: for each held-out candidate task (before the env's retrieval
  filter), whether its gold passage (``gold_passages[0]``) is in the top 3,
  with the question as the query and with the oracle query, BM25 vs dense
  flat, by task kind and overall.

Prints Markdown and writes ``search_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vt_bench.stats import latency_summary

__all__ = ["HNSW_FALLBACK", "add_arguments", "main", "render", "run_benchmark"]

KINDS = ("flat", "hnsw", "ivf")
#: HNSW parameters for a size whose default-parameter build would exceed the budget.
HNSW_FALLBACK = {"hnsw_m": 16, "hnsw_ef_construction": 40}
RECALL_K = 3
SCALE_KS = (3, 10)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queries", type=int, default=256, help="held-out queries per end-to-end series"
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each timed series")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="concurrent asearch calls per wave"
    )
    parser.add_argument("--embed-sample", type=int, default=512, help="passages embedded (timed)")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="*",
        default=[100_000, 1_000_000],
        help="synthetic corpus sizes for the FAISS scale series (the default corpus is always in)",
    )
    parser.add_argument(
        "--noise", type=float, default=0.05, help="per-dimension noise of synthetic passages"
    )
    parser.add_argument(
        "--scale-queries", type=int, default=100, help="pre-encoded queries per scale series"
    )
    parser.add_argument("--batch", type=int, default=32, help="batch size of the batched series")
    parser.add_argument(
        "--hnsw-budget-s",
        type=float,
        default=360.0,
        help="predicted HNSW build time above which the smaller fallback parameters are used",
    )
    parser.add_argument(
        "--tasks", type=int, default=None, help="at most this many held-out tasks (default: all)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def _held_out(corpus: Any, limit: int | None) -> list[Any]:
    """The held-out candidates, round-robin over kinds (so a limit keeps every kind)."""
    from vt_envs.domains.search import TASK_KINDS, candidate_tasks

    test = [c for c in candidate_tasks(corpus) if c.split == "test"]
    queues = [[c for c in test if c.kind == kind] for kind in TASK_KINDS]
    mixed = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    return mixed[:limit] if limit is not None else mixed


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- build ------------------------------------------------------------------------------


def _embedding(corpus: Any, dense: Any, sample: int, repeats: int) -> dict[str, Any]:
    embedder = dense.embedder
    step = max(1, len(corpus) // sample)
    texts = [corpus[i].contents() for i in range(0, len(corpus), step)][:sample]
    embedder.encode(texts[:8], kind="passage")  # warm-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        embedder.encode(texts, kind="passage")
        rates.append(len(texts) / (time.perf_counter() - start))
    rate = statistics.median(rates)
    meta_path = dense.index_path.with_name(dense.index_path.name + ".json")
    cached_build_s = None
    if meta_path.is_file():
        cached_build_s = json.loads(meta_path.read_text()).get("build_s")
    return {
        "embedder": embedder.id,
        "dim": embedder.dim,
        "sample": len(texts),
        "passages_per_s_median": rate,
        "passages_per_s_min": min(rates),
        "passages_per_s_max": max(rates),
        "corpus_passages": len(corpus),
        "corpus_embed_s_extrapolated": len(corpus) / rate,
        "embeddings_mib": len(corpus) * embedder.dim * 4 / 2**20,
        # Recorded by the cache when it built the flat index: embedding the
        # corpus (if its embeddings were not cached yet) plus the flat build.
        "cached_flat_build_s": cached_build_s,
    }


def _bm25_build(corpus: Any) -> dict[str, Any]:
    from vt_envs.domains.search import BM25Retriever

    with tempfile.TemporaryDirectory() as cold:
        start = time.perf_counter()
        retriever = BM25Retriever(corpus, cache=Path(cold))
        wall_s = time.perf_counter() - start
        size = _dir_size(Path(cold))
    return {"build_s": retriever.build_s, "wall_s": wall_s, "size_mib": size / 2**20}


# -- queries ----------------------------------------------------------------------------


def _single_search(retriever: Any, queries: Sequence[str], repeats: int) -> dict[str, Any]:
    retriever.search(list(queries[:2]), 3)  # warm-up
    rates, samples = [], []
    for _ in range(repeats):
        begin = time.perf_counter()
        for query in queries:
            start = time.perf_counter()
            retriever.search([query], 3)
            samples.append(time.perf_counter() - start)
        rates.append(len(queries) / (time.perf_counter() - begin))
    return {"concurrency": 1, **_rates(rates), **latency_summary(samples), "mean_batch": 1.0}


async def _async_search(
    retriever: Any, queries: Sequence[str], repeats: int, concurrency: int
) -> dict[str, Any]:
    async def one(query: str) -> float:
        start = time.perf_counter()
        await retriever.asearch(query, 3)
        return time.perf_counter() - start

    await one(queries[0])  # warm-up: starts the batcher thread
    batcher = retriever.batcher
    batches, merged = batcher.batches, batcher.queries
    rates, samples = [], []
    for _ in range(repeats):
        begin = time.perf_counter()
        for start in range(0, len(queries), concurrency):
            wave = queries[start : start + concurrency]
            samples += await asyncio.gather(*(one(q) for q in wave))
        rates.append(len(queries) / (time.perf_counter() - begin))
    mean_batch = (batcher.queries - merged) / max(1, batcher.batches - batches)
    return {
        "concurrency": concurrency,
        **_rates(rates),
        **latency_summary(samples),
        "mean_batch": mean_batch,
    }


def _rates(rates: list[float]) -> dict[str, float]:
    return {
        "queries_per_s_median": statistics.median(rates),
        "queries_per_s_min": min(rates),
        "queries_per_s_max": max(rates),
    }


def _queries(
    retrievers: dict[str, Any], queries: Sequence[str], repeats: int, concurrency: int
) -> dict[str, Any]:
    report = {}
    for name, retriever in retrievers.items():
        report[name] = {
            "search": _single_search(retriever, queries, repeats),
            "asearch": asyncio.run(_async_search(retriever, queries, repeats, 1)),
            "asearch_concurrent": asyncio.run(
                _async_search(retriever, queries, repeats, concurrency)
            ),
        }
    return report


# -- scale ------------------------------------------------------------------------------


def _synthetic(base: np.ndarray, n: int, noise: float, seed: int = 0) -> np.ndarray:
    """``n`` rows: random real rows plus N(0, noise²) per dimension, renormalized."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), dtype=np.float32)
    for start in range(0, n, 65_536):
        stop = min(n, start + 65_536)
        rows = base[rng.integers(0, len(base), stop - start)]
        rows += noise * rng.standard_normal(rows.shape, dtype=np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        out[start:stop] = rows
    return out


def _file_mib(index: Any) -> float:
    import faiss

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.faiss"
        faiss.write_index(index, str(path))
        return path.stat().st_size / 2**20


def _params(kind: str, config: Any, n: int) -> dict[str, Any]:
    if kind == "hnsw":
        return {
            "m": config.hnsw_m,
            "ef_construction": config.hnsw_ef_construction,
            "ef_search": config.ef_search,
        }
    if kind == "ivf":
        return {"nlist": config.nlist(n), "nprobe": config.ivf_nprobe}
    return {}


def _nlogn(n: int) -> float:
    return n * math.log(max(n, 2))


def _scale_point(
    vectors: np.ndarray,
    queries: np.ndarray,
    repeats: int,
    batch: int,
    hnsw_budget_s: float,
    hnsw_previous: tuple[int, float] | None,
) -> dict[str, Any]:
    from vt_envs.domains.search import IndexConfig, build_index

    n = len(vectors)
    kmax = max(SCALE_KS)
    exact: np.ndarray | None = None
    indexes: dict[str, Any] = {}
    for kind in KINDS:
        config = IndexConfig(kind=kind)
        extra: dict[str, Any] = {}
        if kind == "hnsw" and hnsw_previous is not None:
            previous_n, previous_s = hnsw_previous
            predicted = previous_s * _nlogn(n) / _nlogn(previous_n)
            extra = {"predicted_build_s_default_params": predicted, "fallback": False}
            if predicted > hnsw_budget_s:
                config = IndexConfig(kind=kind, **HNSW_FALLBACK)
                extra["fallback"] = True
        start = time.perf_counter()
        index = build_index(vectors, config)
        build_s = time.perf_counter() - start
        size_mib = _file_mib(index)
        index.search(queries[:2], kmax)  # warm-up
        samples = []
        for i in range(len(queries)):
            start = time.perf_counter()
            index.search(queries[i : i + 1], kmax)
            samples.append(time.perf_counter() - start)
        rates, ids = [], None
        for _ in range(repeats):
            parts = []
            start = time.perf_counter()
            for b in range(0, len(queries), batch):
                parts.append(index.search(queries[b : b + batch], kmax)[1])
            rates.append(len(queries) / (time.perf_counter() - start))
            ids = np.concatenate(parts)
        if kind == "flat":
            exact = ids
        recall = {f"recall_at_{k}": _overlap(ids, exact, k) for k in SCALE_KS}
        indexes[kind] = {
            "params": _params(kind, config, n),
            **extra,
            "build_s": build_s,
            "size_mib": size_mib,
            "single": latency_summary(samples),
            "batch": batch,
            **_rates(rates),
            **recall,
        }
        del index
        gc.collect()
    return indexes


def _overlap(ids: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean fraction of the exact top ``k`` found in the approximate top ``k``."""
    found = [len(set(a[:k]) & set(e[:k])) / k for a, e in zip(ids.tolist(), exact.tolist())]
    return statistics.fmean(found)


def _scale(
    embeddings: np.ndarray,
    queries: np.ndarray,
    sizes: Sequence[int],
    noise: float,
    repeats: int,
    batch: int,
    hnsw_budget_s: float,
) -> list[dict[str, Any]]:
    points = []
    hnsw_previous: tuple[int, float] | None = None
    for n in [len(embeddings), *sorted(sizes)]:
        synthetic = bool(points)  # the first point is the corpus itself
        start = time.perf_counter()
        vectors = _synthetic(embeddings, n, noise, seed=n) if synthetic else embeddings
        make_s = time.perf_counter() - start
        indexes = _scale_point(vectors, queries, repeats, batch, hnsw_budget_s, hnsw_previous)
        hnsw = indexes["hnsw"]
        if not hnsw.get("fallback"):
            hnsw_previous = (n, hnsw["build_s"])
        points.append(
            {
                "passages": n,
                "source": "synthetic" if synthetic else "corpus",
                "noise": noise if synthetic else None,
                "generate_s": make_s if synthetic else None,
                "queries": len(queries),
                "indexes": indexes,
            }
        )
        del vectors
        gc.collect()
    return points


# -- recall -----------------------------------------------------------------------------


def _recall(retrievers: dict[str, Any], candidates: Sequence[Any]) -> dict[str, Any]:
    hits: dict[tuple[str, str], list[bool]] = {}
    for name, retriever in retrievers.items():
        for mode in ("question", "oracle"):
            queries = [c.question if mode == "question" else c.queries[0] for c in candidates]
            found = []
            for start in range(0, len(queries), 256):
                rows = retriever.search(queries[start : start + 256], RECALL_K)
                found += [{h.index for h in row} for row in rows]
            hits[name, mode] = [
                c.gold_passages[0] in row for c, row in zip(candidates, found, strict=True)
            ]
    kinds = sorted({c.kind for c in candidates})
    report: dict[str, Any] = {"k": RECALL_K, "held_out_candidates": len(candidates)}
    for group in [*kinds, "all"]:
        chosen = [i for i, c in enumerate(candidates) if group in ("all", c.kind)]
        report[group] = {
            "n": len(chosen),
            **{
                name: {
                    mode: statistics.fmean(hits[name, mode][i] for i in chosen)
                    for mode in ("question", "oracle")
                }
                for name in retrievers
            },
        }
    return report


# -- the run ----------------------------------------------------------------------------


def run_benchmark(
    queries: int = 256,
    repeats: int = 3,
    concurrency: int = 32,
    embed_sample: int = 512,
    sizes: Sequence[int] = (100_000, 1_000_000),
    noise: float = 0.05,
    scale_queries: int = 100,
    batch: int = 32,
    hnsw_budget_s: float = 360.0,
    tasks: int | None = None,
) -> dict[str, Any]:
    """Run every series; returns the JSON-ready report."""
    import faiss
    import torch

    from vt_envs.domains.search import shared_retriever, vital_articles_corpus

    corpus = vital_articles_corpus()
    start = time.perf_counter()
    dense = shared_retriever("dense", corpus)
    dense_load_s = time.perf_counter() - start
    start = time.perf_counter()
    bm25 = shared_retriever("bm25", corpus)
    bm25_load_s = time.perf_counter() - start
    retrievers = {"bm25": bm25, "dense": dense}
    candidates = _held_out(corpus, tasks)
    oracle = [c.queries[0] for c in candidates]

    build = {
        "corpus": corpus.name,
        "passages": len(corpus),
        "embedding": _embedding(corpus, dense, embed_sample, repeats),
        "bm25": _bm25_build(corpus),
        "load_cached_s": {"dense": dense_load_s, "bm25": bm25_load_s},
    }
    query_report = {
        "queries": len(oracle[:queries]),
        "k": 3,
        **_queries(retrievers, oracle[:queries], repeats, concurrency),
    }
    embeddings = np.ascontiguousarray(dense.embeddings())
    query_vectors = dense.embedder.encode(oracle[:scale_queries], kind="query")
    scale = _scale(embeddings, query_vectors, sizes, noise, repeats, batch, hnsw_budget_s)
    # The index builds over the corpus embeddings are the scale series' first point.
    build["indexes"] = {
        kind: {key: facts[key] for key in ("params", "build_s", "size_mib")}
        for kind, facts in scale[0]["indexes"].items()
    }
    return {
        "build": build,
        "queries": query_report,
        "scale": scale,
        "recall": _recall(retrievers, candidates),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "faiss": faiss.__version__,
            "faiss_omp_threads": faiss.omp_get_max_threads(),
            "torch_threads": torch.get_num_threads(),
        },
    }


# -- Markdown ---------------------------------------------------------------------------


def _describe(kind: str, params: dict[str, Any]) -> str:
    if kind == "hnsw":
        return f"M={params['m']}, efC={params['ef_construction']}, ef={params['ef_search']}"
    if kind == "ivf":
        return f"nlist={params['nlist']}, nprobe={params['nprobe']}"
    return "exact"


def render(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    build, emb, machine = report["build"], report["build"]["embedding"], report["machine"]
    cached = emb["cached_flat_build_s"]
    rows = [
        f"Threads: FAISS (OpenMP) {machine['faiss_omp_threads']}, torch "
        f"{machine['torch_threads']}; {machine['cpus']} CPUs, FAISS {machine['faiss']}.",
        "",
        f"Corpus {build['corpus']}: {build['passages']:,} passages; embedder {emb['embedder']} "
        f"({emb['dim']}-d): **{emb['passages_per_s_median']:.0f} passages/s** median (min "
        f"{emb['passages_per_s_min']:.0f}, max {emb['passages_per_s_max']:.0f}) on "
        f"{emb['sample']} passages.",
        "",
        "| build | time (s) | size (MiB) | note |",
        "|---|---:|---:|---|",
        f"| embed the corpus | {emb['corpus_embed_s_extrapolated']:.0f} "
        f"| {emb['embeddings_mib']:.1f} | extrapolated from {emb['sample']} passages |",
    ]
    if cached is not None:
        rows.append(
            f"| embed + flat index (cache's record) | {cached:.0f} | | when the cache was built |"
        )
    for kind, facts in build["indexes"].items():
        rows.append(
            f"| FAISS {kind} | {facts['build_s']:.2f} | {facts['size_mib']:.1f} "
            f"| {_describe(kind, facts['params'])} |"
        )
    bm25 = build["bm25"]
    rows += [
        f"| BM25 (bm25s, cold) | {bm25['build_s']:.2f} | {bm25['size_mib']:.1f} "
        "| tokenize + index + save |",
        "",
        f"End-to-end search, top {report['queries']['k']}, {report['queries']['queries']} "
        "held-out oracle queries, default corpus (dense = encode + FAISS flat):",
        "",
        "| retriever | mode | concurrency | queries/s | p50 (ms) | p99 (ms) | mean batch |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    modes = {
        "search": "search(), one at a time",
        "asearch": "asearch, one at a time",
        "asearch_concurrent": "asearch, gathered",
    }
    for name in ("dense", "bm25"):
        for mode, label in modes.items():
            s = report["queries"][name][mode]
            rows.append(
                f"| {name} | {label} | {s['concurrency']} | {s['queries_per_s_median']:.1f} "
                f"| {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['mean_batch']:.1f} |"
            )
    scale = report["scale"]
    rows += [
        "",
        f"FAISS alone (queries pre-encoded; {scale[0]['queries']} queries), "
        "synthetic = corpus embeddings + Gaussian noise, renormalized:",
        "",
        "| passages | index | params | build (s) | size (MiB) | single p50 (ms) "
        "| single p99 (ms) | batched queries/s | recall@3 | recall@10 |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for point in scale:
        label = f"{point['passages']:,}" + (
            f" (synthetic, σ={point['noise']:g})" if point["source"] == "synthetic" else ""
        )
        for kind, f in point["indexes"].items():
            params = _describe(kind, f["params"]) + (" (fallback)" if f.get("fallback") else "")
            rows.append(
                f"| {label} | {kind} | {params} | {f['build_s']:.2f} | {f['size_mib']:.1f} "
                f"| {f['single']['p50_ms']:.3f} | {f['single']['p99_ms']:.3f} "
                f"| {f['queries_per_s_median']:.0f} (batch {f['batch']}) "
                f"| {f['recall_at_3']:.3f} | {f['recall_at_10']:.3f} |"
            )
    for point in scale:
        hnsw = point["indexes"]["hnsw"]
        if "predicted_build_s_default_params" in hnsw:
            rows.append(
                f"\nHNSW at {point['passages']:,}: default-parameter build predicted "
                f"{hnsw['predicted_build_s_default_params']:.0f} s"
                + (" (over the budget: fallback parameters)." if hnsw["fallback"] else ".")
            )
    recall = report["recall"]
    rows += [
        "",
        f"Gold passage in the top {recall['k']}, {recall['held_out_candidates']} held-out "
        "candidate tasks (before the retrieval filter):",
        "",
        "| kind | n | BM25, question | BM25, oracle query | dense, question "
        "| dense, oracle query |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for group, r in recall.items():
        if not isinstance(r, dict):
            continue
        rows.append(
            f"| {group} | {r['n']} | {r['bm25']['question']:.3f} | {r['bm25']['oracle']:.3f} "
            f"| {r['dense']['question']:.3f} | {r['dense']['oracle']:.3f} |"
        )
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(
        args.queries,
        args.repeats,
        args.concurrency,
        args.embed_sample,
        args.sizes,
        args.noise,
        args.scale_queries,
        args.batch,
        args.hnsw_budget_s,
        args.tasks,
    )
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "search_speed.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0
