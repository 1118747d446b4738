"""Retrievers: a query → the top-k passages of a corpus; one per process, shared.

Two kinds behind one interface (:class:`Retriever`):

- :class:`DenseRetriever` — an :class:`~vt_envs.domains.search.embedders.Embedder`
  plus a FAISS inner-product index (flat, HNSW or IVF; see
  :mod:`~vt_envs.domains.search.index`), or a user's prebuilt index file
  opened memory-mapped;
- :class:`BM25Retriever` — lexical BM25 through ``bm25s`` (a core
  dependency), the fallback when the ``search`` extra is missing and the
  baseline dense retrieval is compared with.

:func:`shared_retriever` builds each distinct retriever once per process
and hands the same object to every env (a vector env of 64 envs holds one
index). Async callers go through :meth:`Retriever.asearch`, which
micro-batches: concurrent queries (those queued while a batch runs, and,
under concurrency, those arriving within ``batch_window_s``) are encoded and
searched in one call on a background thread, because the encoder's per-call
cost, not the FAISS search, dominates a query.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import hashlib
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vt_envs.domains.search.corpus import Corpus
from vt_envs.domains.search.embedders import (
    SEARCH_EXTRA,
    Embedder,
    default_embedder,
    dense_available,
)
from vt_envs.domains.search.index import (
    IndexConfig,
    apply_search_params,
    cache_dir,
    cache_key,
    cached_array,
    cached_index,
    open_index,
    seal,
    unsealed,
)
from vt_envs.errors import InvalidConfigError

__all__ = [
    "RETRIEVERS",
    "BM25Retriever",
    "DenseRetriever",
    "Hit",
    "QueryBatcher",
    "Retriever",
    "resolve_retriever_kind",
    "shared_retriever",
]

logger = logging.getLogger(__name__)

RETRIEVERS = ("auto", "dense", "bm25")
#: The manifest inside a cached BM25 index directory (see :func:`~.index.unsealed`).
_BM25_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its corpus position and score (higher is better)."""

    index: int
    score: float


class QueryBatcher:
    """Merges concurrent queries into batched calls of ``search(queries, k)`` on one thread.

    The worker thread takes the first waiting query and everything already
    queued behind it (up to ``max_batch``); queries that arrive while a
    batch runs form the next one. When the last batch held more than one
    query (callers are concurrent), it also waits up to ``window_s`` for
    more before running; a lone caller never waits. It runs one batched
    search and resolves every query's future. Callers on any thread or
    event loop get a :class:`concurrent.futures.Future`.
    """

    def __init__(
        self,
        search: callable,
        *,
        window_s: float = 0.002,
        max_batch: int = 64,
        name: str = "retriever",
    ):
        self._search, self.window_s, self.max_batch = search, window_s, max_batch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._name = name
        self.batches = 0
        self.queries = 0
        self._last_batch = 1
        self._pid = os.getpid()

    def submit(self, query: str, k: int) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._ensure_thread()
        self._queue.put((query, k, future))
        return future

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's thread is not here
            with self._start_lock:
                if self._pid != os.getpid():
                    self._queue, self._thread, self._pid = queue.SimpleQueue(), None, os.getpid()
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"vt-{self._name}-batcher", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            window = self.window_s if self._last_batch > 1 else 0.0
            deadline = time.monotonic() + window
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    batch.append(
                        self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                    )
                except queue.Empty:
                    break
            self._last_batch = len(batch)
            live = [item for item in batch if item[2].set_running_or_notify_cancel()]
            if not live:
                continue
            self.batches += 1
            self.queries += len(live)
            try:
                results = self._search([q for q, _, _ in live], max(k for _, k, _ in live))
            except Exception:
                # One bad query must not fail the others it was batched with: run
                # them one by one, so a failure stays with the query that caused it.
                self._run_alone(live)
                continue
            for (_, k, future), hits in zip(live, results):
                future.set_result(hits[:k])

    def _run_alone(self, items: list) -> None:
        for query, k, future in items:
            try:
                future.set_result(self._search([query], k)[0][:k])
            except Exception as exc:  # a retriever bug fails this query, not the thread
                future.set_exception(exc)


class Retriever(abc.ABC):
    """Searches one corpus. Thread-safe; shared by every env of a process.

    Attributes:
        corpus: the passages hit indices refer to.
        name: what it is (``"bm25"``, ``"dense:all-MiniLM-L6-v2/flat"``), for logs and caches.
    """

    corpus: Corpus
    name: str

    def __init__(self, *, batch_window_s: float = 0.002, max_batch: int = 64):
        self.batcher = QueryBatcher(
            self.search, window_s=batch_window_s, max_batch=max_batch, name=type(self).__name__
        )

    @abc.abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The top ``k`` hits of each query, best first (blocking; one batched call)."""

    async def asearch(self, query: str, k: int) -> list[Hit]:
        """The top ``k`` hits of ``query``, micro-batched with concurrent callers."""
        return await asyncio.wrap_future(self.batcher.submit(query, k))

    @property
    @abc.abstractmethod
    def index_bytes(self) -> int:
        """The size of the index data (what one more copy per env would cost)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} over {self.corpus!r}>"


class DenseRetriever(Retriever):
    """Embedder + FAISS inner-product index.

    Args:
        corpus: the passages (FAISS id i = ``corpus[i]``).
        embedder: encodes queries (and passages, when building).
        index: which index to build (:class:`IndexConfig` or a kind name).
        index_path: a prebuilt index file to open memory-mapped instead of
            building one (e.g. Search-R1's ``e5_Flat.index`` with its corpus
            and an e5 embedder); it must hold ``len(corpus)`` vectors of the
            embedder's dimension.
        cache: directory of cached embeddings and indexes (default :func:`cache_dir`).
        progress: show a progress bar while embedding the corpus.
    """

    def __init__(
        self,
        corpus: Corpus,
        embedder: Embedder,
        *,
        index: IndexConfig | str | None = None,
        index_path: str | os.PathLike[str] | None = None,
        cache: Path | None = None,
        progress: bool = True,
        **batching: float,
    ):
        super().__init__(**batching)
        self.corpus, self.embedder = corpus, embedder
        self.config = IndexConfig.coerce(index)
        self.build_s = 0.0
        if index_path is not None:
            self.index_path = Path(index_path)
            self.index = open_index(index_path)
            apply_search_params(self.index, self.config)
            stat = self.index_path.stat()
            where = f"{self.index_path.resolve()}\x00{stat.st_size}\x00{stat.st_mtime_ns}"
            source = f"prebuilt-{hashlib.sha256(where.encode()).hexdigest()[:10]}"
            if self.config.kind != "flat":
                source += f"-{self.config.describe(len(corpus))}"
        else:
            directory = (cache or cache_dir()) / cache_key(corpus.content_hash, embedder.id)
            self.index, self.index_path, self.build_s = cached_index(
                directory,
                lambda: self.embeddings(directory, progress=progress),
                len(corpus),
                self.config,
                self._cache_key(),
            )
            source = self.config.describe(len(corpus))
        if self.index.ntotal != len(corpus) or self.index.d != embedder.dim:
            raise InvalidConfigError(
                f"the index {str(self.index_path)!r} holds {self.index.ntotal} vectors of "
                f"dimension {self.index.d}, but the corpus has {len(corpus)} passages and the "
                f"embedder {embedder.id!r} makes {embedder.dim}-d vectors; use the corpus and "
                "embedder the index was built from."
            )
        self.name = f"dense:{embedder.id}/{source}"

    def _cache_key(self) -> dict[str, object]:
        """What the cached embeddings (and the indexes over them) are built from."""
        corpus, embedder = self.corpus, self.embedder
        return {"corpus": corpus.content_hash, "embedder": embedder.id, "dim": embedder.dim,
                "passages": len(corpus)}  # fmt: skip

    def embeddings(self, directory: Path | None = None, *, progress: bool = False) -> np.ndarray:
        """The corpus embeddings (cached as ``embeddings.npy`` next to the indexes, sealed)."""
        directory = directory or self.index_path.parent
        return cached_array(
            directory / "embeddings.npy", lambda: self._embed_corpus(progress), self._cache_key()
        )

    def _embed_corpus(self, progress: bool) -> np.ndarray:
        texts = [p.contents() for p in self.corpus]
        chunk = 512
        out = np.empty((len(texts), self.embedder.dim), dtype=np.float32)
        bar = _progress(len(texts), f"embedding {self.corpus.name}", progress)
        for start in range(0, len(texts), chunk):
            out[start : start + chunk] = self.embedder.encode(
                texts[start : start + chunk], kind="passage"
            )
            bar.update(min(chunk, len(texts) - start))
        bar.close()
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        vectors = self.embedder.encode(list(queries), kind="query")
        scores, ids = self.index.search(vectors, min(k, len(self.corpus)))
        return [
            [Hit(int(i), float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
            for row_ids, row_scores in zip(ids, scores)
        ]

    @property
    def index_bytes(self) -> int:
        return self.index_path.stat().st_size


class BM25Retriever(Retriever):
    """Okapi BM25 through ``bm25s`` (English stopwords removed), cached on disk."""

    def __init__(self, corpus: Corpus, *, cache: Path | None = None, **batching: float):
        super().__init__(**batching)
        import bm25s

        self.corpus = corpus
        self.name = "bm25"
        directory = (cache or cache_dir()) / cache_key(corpus.content_hash, "bm25s")
        key = {"corpus": corpus.content_hash, "passages": len(corpus), "bm25s": bm25s.__version__}
        start = time.perf_counter()
        self._bm25 = None
        if directory.is_dir():
            files = sorted(p for p in directory.iterdir() if p.name != _BM25_MANIFEST)
            reason = unsealed(directory / _BM25_MANIFEST, files, key)
            if reason is None:
                try:
                    self._bm25 = bm25s.BM25.load(str(directory), mmap=True, allow_pickle=False)
                    self.build_s = 0.0
                except Exception as exc:  # sealed, yet bm25s cannot read it
                    reason = f"it is unreadable ({exc!r})"
            if reason is not None:
                logger.warning(
                    "the cached BM25 index %s cannot be used: %s; rebuilding it", directory, reason
                )
                shutil.rmtree(directory, ignore_errors=True)
        if self._bm25 is None:
            self._bm25 = self._build(corpus, directory, key)
            self.build_s = time.perf_counter() - start
        self._lock = threading.Lock()

    @staticmethod
    def _build(corpus: Corpus, directory: Path, key: dict[str, object]) -> object:
        """Index ``corpus``, save it sealed to a temporary directory, rename it into place."""
        import bm25s

        tokens = bm25s.tokenize([p.contents() for p in corpus], stopwords="en", show_progress=False)
        bm25 = bm25s.BM25()
        bm25.index(tokens, show_progress=False)
        tmp = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
        bm25.save(str(tmp), allow_pickle=False)
        seal(tmp / _BM25_MANIFEST, sorted(tmp.iterdir()), key)
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, directory)
        except OSError:  # another process saved it first
            shutil.rmtree(tmp, ignore_errors=True)
        return bm25

    @property
    def index_bytes(self) -> int:
        return sum(getattr(v, "nbytes", 0) for v in self._bm25.scores.values())

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        import bm25s

        if not queries:
            return []
        k = min(k, len(self.corpus))
        with self._lock:  # bm25s keeps per-call state on the tokenizer and the index
            tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
            results, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        # A passage sharing no term with the query scores 0: it is no hit.
        return [
            [Hit(int(i), float(s)) for i, s in zip(row_ids, row_scores) if s > 0]
            for row_ids, row_scores in zip(results, scores)
        ]


def _progress(total: int, desc: str, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the train and search extras

        class _Silent:
            def update(self, n: int) -> None: ...

            def close(self) -> None: ...

        return _Silent()
    return tqdm(total=total, desc=desc, unit="passage", disable=not enabled, leave=False)


_SHARED: dict[tuple, Retriever] = {}
_SHARED_LOCK = threading.Lock()
_WARNED_FALLBACK = False


def resolve_retriever_kind(kind: str) -> str:
    """``"auto"`` → ``"dense"`` when the ``search`` extra is installed, else ``"bm25"``
    (saying so once per process)."""
    global _WARNED_FALLBACK
    if kind not in RETRIEVERS:
        raise InvalidConfigError(f"retriever must be one of {RETRIEVERS}, got {kind!r}")
    if kind != "auto":
        return kind
    if dense_available():
        return "dense"
    if not _WARNED_FALLBACK:
        _WARNED_FALLBACK = True
        logger.warning(
            "VT-Search-v0: dense retrieval needs the search extra (pip install '%s'); "
            "falling back to BM25. Pass retriever='bm25' to choose it explicitly.",
            SEARCH_EXTRA,
        )
    return "bm25"


def shared_retriever(
    kind: str,
    corpus: Corpus,
    *,
    embedder: Embedder | None = None,
    index: IndexConfig | str | None = None,
    index_path: str | os.PathLike[str] | None = None,
) -> Retriever:
    """The process-wide retriever of ``kind`` over ``corpus`` (built or loaded on first use).

    The same arguments return the same object, so every env of a process
    shares one index and one encoder. Keyed by (corpus hash, kind, embedder
    id, index configuration or prebuilt path).
    """
    kind = resolve_retriever_kind(kind)
    if kind == "bm25":
        key: tuple = (corpus.content_hash, "bm25")
    else:
        embedder = embedder or default_embedder()
        config = IndexConfig.coerce(index)
        where = str(Path(index_path).resolve()) if index_path is not None else None
        key = (corpus.content_hash, "dense", embedder.id, config, where)
    with _SHARED_LOCK:
        retriever = _SHARED.get(key)
        if retriever is None:
            if kind == "bm25":
                retriever = BM25Retriever(corpus)
            else:
                retriever = DenseRetriever(corpus, embedder, index=index, index_path=index_path)
            _SHARED[key] = retriever
        return retriever
