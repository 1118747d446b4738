"""Retrieval QA tasks generated from a corpus, with known answers and a fixed held-out split.

Five kinds, each answerable only from the corpus: ``masked_subject`` and
``year_cloze`` (one hop, :mod:`~vt_envs.domains.search.candidates`), and
``two_hop``, ``two_hop_capital`` and ``two_hop_founded`` (article A names
article B; the answer is a fact only B states, :mod:`~vt_envs.domains.search.bridges`).

A candidate is kept only if

(a) its answer is not in its question (checked at generation);
(b) each hop's *oracle query* retrieves that hop's passage in the top
    :data:`FILTER_K` with **both** retrievers, BM25 and the dense default
    (all-MiniLM-L6-v2, flat), so the task set is the same whichever
    retriever the env uses (and whatever its ``top_k``);
(c) on the held-out split, a real model does not answer it closed-book
    (SmolLM2-135M-Instruct, greedy, from the question alone; applied when
    the shipped ``closed_book.json`` exists and matches).

For the default corpus (b) and (c) are shipped as data
(``vt_envs/assets/search/``, recomputed by ``scripts/search_task_filter.py``
and ``scripts/search_closed_book.py``), so the set never depends on what is
installed. Over a user's corpus (b) uses BM25 plus the env's own retriever
when it is dense (so a dense env's set is the part of BM25's that both
find; the ids are cached), and (c) is not applied.

The split is a property of the article (a hash of its title): about one
article in ten is held out, for every kind, so no held-out article's text is
the subject of a training question.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

from vt_envs.core.task import Task, TaskList
from vt_envs.domains.search.bridges import BRIDGE_KINDS, Bridges, bridge_tasks
from vt_envs.domains.search.candidates import Candidate, masked_subject, split_of, year_cloze
from vt_envs.domains.search.corpus import Corpus
from vt_envs.domains.search.index import (
    cache_dir,
    cache_key,
    manifest_of,
    publish,
    unsealed,
)
from vt_envs.domains.search.retriever import Retriever, shared_retriever
from vt_envs.errors import InvalidConfigError

__all__ = [
    "FILTER_K",
    "GENERATOR_VERSION",
    "TASK_KINDS",
    "Candidate",
    "candidate_tasks",
    "candidates_digest",
    "closed_book_ids",
    "retrievable",
    "search_tasks",
    "shipped_filter",
    "split_of",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

TASK_KINDS = ("masked_subject", "year_cloze", *BRIDGE_KINDS)
#: Bumped whenever generation changes, so cached filters are rebuilt.
GENERATOR_VERSION = 5
#: The rank within which each hop's oracle query must retrieve its passage.
FILTER_K = 3
RETRIEVAL_FILE = "retrievable.json"
CLOSED_BOOK_FILE = "closed_book.json"


def candidate_tasks(corpus: Corpus, kinds: Sequence[str] = TASK_KINDS) -> list[Candidate]:
    """Every generated task of ``kinds`` (both splits), before the filters.

    Deterministic: a function of the corpus text only.
    """
    unknown = sorted(set(kinds) - set(TASK_KINDS))
    if unknown:
        raise InvalidConfigError(f"unknown task kind(s) {unknown}; known: {list(TASK_KINDS)}")
    out: list[Candidate] = []
    if "masked_subject" in kinds:
        out += [c for i, p in enumerate(corpus) if (c := masked_subject(i, p))]
    if "year_cloze" in kinds:
        out += [c for i, p in enumerate(corpus) if (c := year_cloze(i, p))]
    bridging = [k for k in BRIDGE_KINDS if k in kinds]
    if bridging:
        bridges = Bridges(corpus, bridging)
        found = [c for i, p in enumerate(corpus) for c in bridge_tasks(i, p, bridges)]
        out += [c for kind in bridging for c in found if c.kind == kind]
    return _assign_splits(corpus, out)


def _assign_splits(corpus: Corpus, candidates: list[Candidate]) -> list[Candidate]:
    """Held-out articles: one title in ten by hash, plus every article A whose two-hop
    bridge B is held out. A task is ``test`` if all its articles are held out,
    ``train`` if none is, and dropped otherwise, so no training question shows a
    held-out question's answer (a train question about B would)."""
    held_out = {i for i, p in enumerate(corpus) if split_of(p.title) == "test"}
    held_out |= {c.gold_passages[0] for c in candidates if c.gold_passages[-1] in held_out}
    out = []
    for c in candidates:
        inside = [j in held_out for j in c.gold_passages]
        if all(inside) or not any(inside):
            titles = "\x00".join(corpus[j].title for j in c.gold_passages)
            key = hashlib.sha256(f"{c.kind}\x00{titles}".encode()).hexdigest()[:12]
            split = "test" if all(inside) else "train"
            out.append(dataclasses.replace(c, split=split, key=key))
    return out


def candidates_digest(candidates: Sequence[Candidate]) -> str:
    """A digest of the candidates' ids and content: a shipped filter applies only to
    exactly the candidates it was computed over."""
    h = hashlib.sha256()
    for c in sorted(candidates, key=lambda c: c.id):
        h.update(json.dumps([c.id, c.question, c.golds, c.queries]).encode())
    return h.hexdigest()[:16]


def retrievable(
    candidates: Sequence[Candidate], retriever: Retriever, k: int, *, batch: int = 256
) -> list[bool]:
    """Whether every hop's oracle query retrieves its gold passage in the top ``k``."""
    queries = [
        (c_i, q, gold)
        for c_i, c in enumerate(candidates)
        for q, gold in zip(c.queries, c.gold_passages)
    ]
    ok = [True] * len(candidates)
    for start in range(0, len(queries), batch):
        chunk = queries[start : start + batch]
        hits = retriever.search([q for _, q, _ in chunk], k)
        for (c_i, _, gold), row in zip(chunk, hits):
            if gold not in {h.index for h in row}:
                ok[c_i] = False
    return ok


def _shipped(name: str) -> dict[str, Any] | None:
    path = resources.files("vt_envs") / "assets" / "search" / name
    return json.loads(path.read_text()) if path.is_file() else None


def shipped_filter(
    name: str, corpus: Corpus, candidates: Sequence[Candidate], split: str
) -> dict[str, Any] | None:
    """The shipped filter ``name`` for ``split``, if it was computed over exactly these
    candidates of ``corpus`` by this generator version (else ``None``)."""
    data = _shipped(name)
    if data is None or data.get("corpus") != corpus.content_hash:
        return None
    mine = [c for c in candidates if c.split == split]
    entry = data.get("splits", {}).get(split)
    if data.get("generator_version") != GENERATOR_VERSION or entry is None:
        return None
    if entry.get("candidates_digest") != candidates_digest(mine):
        logger.warning("the shipped %s no longer matches the generated tasks; ignoring it", name)
        return None
    return entry


def closed_book_ids(corpus: Corpus, candidates: Sequence[Candidate], split: str) -> set[str]:
    """Ids of ``split``'s tasks the closed-book model answers (shipped for the default
    corpus's held-out split; empty elsewhere)."""
    entry = shipped_filter(CLOSED_BOOK_FILE, corpus, candidates, split)
    return {f"search/{split}/{key}" for key in entry["answered"]} if entry else set()


def _filter_retrievers(retriever: Retriever) -> list[Retriever]:
    """BM25 always, plus the env's own retriever when it is dense."""
    bm25 = shared_retriever("bm25", retriever.corpus)
    return [bm25] if retriever.name == "bm25" else [bm25, retriever]


def _kept_ids(candidates: Sequence[Candidate], retriever: Retriever, split: str) -> set[str]:
    """Ids of ``split``'s candidates that pass the retrieval check: shipped for the
    default corpus, else computed with :func:`_filter_retrievers` (cached on disk)."""
    corpus = retriever.corpus
    mine = [c for c in candidates if c.split == split]
    entry = shipped_filter(RETRIEVAL_FILE, corpus, candidates, split)
    if entry is not None:
        dropped = {f"search/{split}/{key}" for key in entry["dropped"]}
        return {c.id for c in mine} - dropped
    filters = _filter_retrievers(retriever)
    names = "+".join(sorted(r.name for r in filters))
    parts = (corpus.content_hash, names, split, f"k{FILTER_K}", f"v{GENERATOR_VERSION}")

    def compute() -> list[str]:
        ok = [True] * len(mine)
        for r in filters:
            ok = [a and b for a, b in zip(ok, retrievable(mine, r, FILTER_K))]
        return [c.id for c, good in zip(mine, ok) if good]

    def read(kept: Any) -> list[str]:
        if isinstance(kept, list) and all(isinstance(i, str) for i in kept):
            return kept
        raise TypeError("not a list of task ids")

    return set(_cached_json("kept_ids", parts, compute, read))


def _cached_json(
    what: str, parts: Sequence[str], compute: Callable[[], Any], read: Callable[[Any], T]
) -> T:
    """``read`` of the JSON cached under ``$VT_CACHE_DIR/search/tasks`` for ``parts``;
    if missing, unsealed or unreadable (a warning says why): ``compute()``, cached."""
    path = cache_dir() / "tasks" / f"{cache_key(*parts)}.json"
    key = {what: list(parts)}
    if path.is_file():
        reason = unsealed(manifest_of(path), [path], key)
        if reason is None:
            try:
                return read(json.loads(path.read_text()))
            except (ValueError, TypeError, KeyError) as exc:
                reason = f"it is unreadable ({exc})"
        logger.warning("the cached search %s %s cannot be used: %s", what, path, reason)
        path.unlink(missing_ok=True)
    data = compute()
    publish(path, lambda tmp: tmp.write_text(json.dumps(data)), key, lambda tmp: None)
    return read(data)


def to_task(candidate: Candidate, corpus: Corpus) -> Task:
    return Task(
        id=candidate.id,
        prompt=candidate.question,
        gold=list(candidate.golds),
        metadata={"kind": candidate.kind, "hops": len(candidate.queries), "source": corpus.name},
        # Privileged (like the gold): what the oracle searches for, and where the answer is.
        assets={
            "oracle_queries": list(candidate.queries),
            "gold_titles": [corpus[j].title for j in candidate.gold_passages],
        },
    )


def search_tasks(
    split: str,
    *,
    retriever: Retriever,
    top_k: int = FILTER_K,
    kinds: Sequence[str] = TASK_KINDS,
    size: int | None = None,
) -> TaskList:
    """The generated tasks of ``split`` over ``retriever.corpus`` that pass the filters.

    ``top_k`` is the env's (kept for the signature): the filters use :data:`FILTER_K`,
    so the set does not depend on it.
    """
    if split not in ("train", "test"):
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    filters = "+".join(sorted(r.name for r in _filter_retrievers(retriever)))
    key = (retriever.corpus.content_hash, filters, split, tuple(kinds), size)
    with _TASKS_LOCK:  # every env of a process shares one (immutable) task list
        tasks = _TASKS.get(key)
        if tasks is None:
            tasks = _TASKS[key] = _search_tasks(split, retriever, kinds, size)
    return tasks


_CANDIDATES: dict[str, list[Candidate]] = {}


def _all_candidates(corpus: Corpus) -> list[Candidate]:
    """:func:`candidate_tasks` of ``corpus``, once per process (both splits use it) and
    cached on disk per (corpus, generator version): generating them compiles tens of
    thousands of per-article patterns (~40 s on 2 cores); reading them back, ~1 s."""
    found = _CANDIDATES.get(corpus.content_hash)
    if found is None:
        found = _CANDIDATES[corpus.content_hash] = _cached_candidates(corpus)
    return found


def _cached_candidates(corpus: Corpus) -> list[Candidate]:
    parts = (corpus.content_hash, "candidates", f"v{GENERATOR_VERSION}")
    return _cached_json(
        "candidates",
        parts,
        lambda: [dataclasses.asdict(c) for c in candidate_tasks(corpus)],
        lambda rows: [_candidate_from_json(row) for row in rows],
    )


def _candidate_from_json(row: dict) -> Candidate:
    fields = {f.name: f for f in dataclasses.fields(Candidate)}
    if set(row) != set(fields):
        raise KeyError(f"fields {sorted(row)} are not Candidate's {sorted(fields)}")
    return Candidate(**{k: tuple(v) if isinstance(v, list) else v for k, v in row.items()})


_TASKS: dict[tuple, TaskList] = {}
_TASKS_LOCK = threading.Lock()


def _search_tasks(
    split: str, retriever: Retriever, kinds: Sequence[str], size: int | None
) -> TaskList:
    corpus = retriever.corpus
    everything = _all_candidates(corpus)
    kept = _kept_ids(everything, retriever, split) - closed_book_ids(corpus, everything, split)
    chosen = [c for c in everything if c.split == split and c.kind in kinds and c.id in kept]
    if size is not None:
        chosen = chosen[:size] if len(kinds) == 1 else _interleave(chosen, kinds)[:size]
    if not chosen:
        raise InvalidConfigError(
            f"no {split} tasks of kinds {list(kinds)} survive the retrieval check over "
            f"{corpus!r} at k={FILTER_K}"
        )
    return TaskList([to_task(c, corpus) for c in chosen], name="search", split=split)


def _interleave(candidates: Sequence[Candidate], kinds: Sequence[str]) -> list[Candidate]:
    """Round-robin over kinds, so a size cap keeps every kind."""
    queues = [[c for c in candidates if c.kind == kind] for kind in kinds]
    longest = max(map(len, queues))
    return [q[i] for i in range(longest) for q in queues if i < len(q)]
