"""Retrievers: index kinds, the on-disk cache, prebuilt memory-mapped indexes,
micro-batching, BM25, the process-wide sharing and the BM25 fallback."""

from __future__ import annotations

import asyncio
import logging
import os

import faiss
import numpy as np
import pytest
from search_helpers import HashingEmbedder

import vt_envs
from vt_envs.domains.search import retriever as retriever_module
from vt_envs.domains.search.index import INDEX_KINDS, IndexConfig, build_index, open_index
from vt_envs.domains.search.retriever import (
    BM25Retriever,
    DenseRetriever,
    resolve_retriever_kind,
    shared_retriever,
)
from vt_envs.errors import InvalidConfigError


def _titles(retriever, query, k=2):
    return [retriever.corpus[h.index].title for h in retriever.search([query], k)[0]]


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_every_index_kind_finds_the_passage(kind, small_corpus, embedder, tmp_path):
    dense = DenseRetriever(small_corpus, embedder, index=kind, cache=tmp_path, progress=False)
    assert _titles(dense, "capital of Portugal Atlantic Tagus")[0] == "Lisbon"
    assert dense.name.startswith(f"dense:hashing-512/{kind}")


def test_embeddings_and_index_are_cached_by_corpus_and_embedder(small_corpus, tmp_path):
    first = HashingEmbedder()
    DenseRetriever(small_corpus, first, cache=tmp_path, progress=False)
    assert first.calls == [len(small_corpus)]  # the corpus was embedded once

    again = HashingEmbedder()
    cached = DenseRetriever(small_corpus, again, cache=tmp_path, progress=False)
    assert again.calls == [] and cached.build_s == 0.0  # read from disk

    other = HashingEmbedder(id="hashing-512-v2")  # another model: never another's vectors
    DenseRetriever(small_corpus, other, cache=tmp_path, progress=False)
    assert other.calls == [len(small_corpus)]
    assert len(list(tmp_path.glob("*/embeddings.npy"))) == 2


def test_prebuilt_index_is_opened_and_checked(small_corpus, embedder, tmp_path):
    vectors = embedder.encode([p.contents() for p in small_corpus], kind="passage")
    path = tmp_path / "user.index"
    faiss.write_index(build_index(vectors, IndexConfig()), str(path))
    dense = DenseRetriever(small_corpus, embedder, index_path=path)
    assert _titles(dense, "capital of Austria Danube")[0] == "Vienna"
    assert dense.name.startswith("dense:hashing-512/prebuilt-")

    faiss.write_index(build_index(vectors[:3], IndexConfig()), str(path))
    with pytest.raises(InvalidConfigError, match="holds 3 vectors"):
        DenseRetriever(small_corpus, embedder, index_path=path)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_flat_index_file_is_memory_mapped_not_copied(tmp_path):
    vectors = np.random.default_rng(0).random((200_000, 64), dtype=np.float32)  # 49 MiB
    path = tmp_path / "big.index"
    faiss.write_index(build_index(vectors, IndexConfig()), str(path))
    del vectors
    before = _rss_mb()
    index = open_index(path)
    grew = _rss_mb() - before
    assert index.ntotal == 200_000
    assert grew < 10, f"opening the index took {grew:.0f} MiB of private memory"


def test_concurrent_queries_share_one_encoder_call(small_corpus, embedder, tmp_path):
    dense = DenseRetriever(
        small_corpus, embedder, cache=tmp_path, progress=False, batch_window_s=0.05
    )
    embedder.calls.clear()
    queries = ["France Seine", "Germany populous", "Spain Iberian", "Italy Romulus"] * 4

    async def ask():
        return await asyncio.gather(*(dense.asearch(q, 1) for q in queries))

    results = asyncio.run(ask())
    assert len(embedder.calls) < len(queries) / 2, embedder.calls  # batched, not one per query
    assert sum(embedder.calls) == len(queries)
    titles = [small_corpus[hits[0].index].title for hits in results]
    assert titles == ["Paris", "Berlin", "Madrid", "Rome"] * 4  # each query got its own hits


def test_a_failing_batch_fails_its_queries_not_the_batcher(small_corpus, tmp_path):
    class Flaky(HashingEmbedder):
        failures = 2  # the batch, then the query run alone

        def encode(self, texts, *, kind="query"):
            if kind == "query" and self.failures:
                self.failures -= 1
                raise RuntimeError("encoder broke")
            return super().encode(texts, kind=kind)

    dense = DenseRetriever(small_corpus, Flaky(), cache=tmp_path, progress=False)
    with pytest.raises(RuntimeError, match="encoder broke"):
        asyncio.run(dense.asearch("capital of Spain", 1))
    assert (
        small_corpus[asyncio.run(dense.asearch("capital of Spain", 1))[0].index].title == "Madrid"
    )


def test_bm25_ranks_by_terms_and_returns_no_hit_without_a_shared_term(small_corpus, tmp_path):
    bm25 = BM25Retriever(small_corpus, cache=tmp_path)
    assert _titles(bm25, "Danube river capital")[0] == "Vienna"
    assert bm25.search(["xylophone quasar"], 3) == [[]]
    reloaded = BM25Retriever(small_corpus, cache=tmp_path)
    assert reloaded.build_s == 0.0 and _titles(reloaded, "Romulus legend")[0] == "Rome"


def test_shared_retriever_is_one_object_per_configuration(
    small_corpus, embedder, monkeypatch, tmp_path
):
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path))
    flat = shared_retriever("dense", small_corpus, embedder=embedder)
    assert shared_retriever("dense", small_corpus, embedder=embedder) is flat
    assert shared_retriever("dense", small_corpus, embedder=embedder, index="hnsw") is not flat
    assert shared_retriever("bm25", small_corpus) is shared_retriever("bm25", small_corpus)


@pytest.mark.parametrize("kind", ["dense", "bm25"])
def test_vector_env_of_64_holds_one_index(kind):
    first = vt_envs.make("VT-Search-v0", retriever=kind)
    retriever = first.tools["search"].retriever
    before = _rss_mb()
    vec = vt_envs.make_vec("VT-Search-v0", num_envs=64, retriever=kind)
    grew = _rss_mb() - before
    try:
        assert all(env.tools["search"].retriever is retriever for env in vec.envs)
        # One copy per env would be 64 x the index; the whole vector env costs less than one.
        index_mib = retriever.index_bytes / 2**20
        assert grew < index_mib, f"64 envs took {grew:.1f} MiB (index: {index_mib:.1f} MiB)"
    finally:
        vec.close()
        first.close()


def test_auto_falls_back_to_bm25_once_naming_the_extra(monkeypatch, caplog):
    monkeypatch.setattr(retriever_module, "dense_available", lambda: False)
    monkeypatch.setattr(retriever_module, "_WARNED_FALLBACK", False)
    with caplog.at_level(logging.WARNING, logger=retriever_module.__name__):
        assert resolve_retriever_kind("auto") == "bm25"
        assert resolve_retriever_kind("auto") == "bm25"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "vt-envs[search]" in messages[0]
    assert resolve_retriever_kind("dense") == "dense"  # an explicit choice is kept
    with pytest.raises(InvalidConfigError, match="retriever must be one of"):
        resolve_retriever_kind("splade")


def test_one_failing_query_does_not_fail_the_queries_batched_with_it(small_corpus, tmp_path):
    class Picky(HashingEmbedder):
        def encode(self, texts, *, kind="query"):
            if kind == "query" and any("poison" in t for t in texts):
                if len(texts) == 1:
                    raise TypeError("cannot encode this query")
                raise TypeError("a batch holding the bad query")
            return super().encode(texts, kind=kind)

    dense = DenseRetriever(
        small_corpus, Picky(), cache=tmp_path, progress=False, batch_window_s=0.05
    )

    async def ask():
        queries = ["France Seine", "poison", "Italy Romulus", "Spain Iberian"]
        return await asyncio.gather(*(dense.asearch(q, 1) for q in queries), return_exceptions=True)

    good, bad, *rest = asyncio.run(ask())
    assert isinstance(bad, TypeError) and "this query" in str(bad)
    assert [small_corpus[r[0].index].title for r in (good, *rest)] == ["Paris", "Rome", "Madrid"]


def test_the_batcher_restarts_in_a_forked_child(small_corpus, embedder, tmp_path):
    import multiprocessing

    dense = DenseRetriever(small_corpus, embedder, cache=tmp_path, progress=False)
    asyncio.run(dense.asearch("France", 1))  # the parent's batcher thread is running
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_search_once, args=(dense,))
    child.start()
    child.join(timeout=20)
    assert child.exitcode == 0


def _search_once(dense) -> None:
    hits = asyncio.run(asyncio.wait_for(dense.asearch("capital of Austria Danube", 1), 5))
    raise SystemExit(0 if dense.corpus[hits[0].index].title == "Vienna" else 1)


def test_index_parameters_and_models_are_part_of_every_cache_key(small_corpus, embedder, tmp_path):
    from vt_envs.domains.search.embedders import _weights_digest

    names = {
        DenseRetriever(small_corpus, embedder, index=cfg, cache=tmp_path, progress=False).name
        for cfg in (
            {"kind": "ivf", "ivf_nprobe": 1},
            {"kind": "ivf"},
            {"kind": "hnsw", "ef_search": 8},
            "hnsw",
        )
    }
    assert len(names) == 4
    for name, data in (("a", b"\x00" * 64), ("b", b"\x00" * 63 + b"\x01")):  # same size
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(data)
    assert _weights_digest(tmp_path / "a") != _weights_digest(tmp_path / "b")


def test_unreadable_cache_files_are_rebuilt_and_a_bad_prebuilt_index_is_named(
    small_corpus, tmp_path, caplog
):
    DenseRetriever(small_corpus, HashingEmbedder(), cache=tmp_path, progress=False)
    (index_file,) = tmp_path.glob("*/index-flat.faiss")
    (embeddings,) = tmp_path.glob("*/embeddings.npy")
    index_file.write_bytes(index_file.read_bytes()[:100])
    embeddings.write_bytes(embeddings.read_bytes()[:200])
    with caplog.at_level(logging.WARNING):
        rebuilt = DenseRetriever(small_corpus, HashingEmbedder(), cache=tmp_path, progress=False)
    assert _titles(rebuilt, "Danube river Austria")[0] == "Vienna"
    assert sum("cannot be used" in r.getMessage() for r in caplog.records) == 2

    garbage = tmp_path / "user.index"
    garbage.write_bytes(b"not an index")
    with pytest.raises(InvalidConfigError, match=r"user\.index.*not a readable FAISS index"):
        DenseRetriever(small_corpus, HashingEmbedder(), index_path=garbage)

    BM25Retriever(small_corpus, cache=tmp_path)
    (vocab,) = tmp_path.glob("*bm25s*/vocab.index.json")
    vocab.write_text("{ broken")
    assert _titles(BM25Retriever(small_corpus, cache=tmp_path), "Romulus legend")[0] == "Rome"


class _Planted:
    """Unpickling this creates ``path``: proof that a cache file was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_cached_array_is_never_unpickled_even_with_a_matching_manifest(small_corpus, tmp_path):
    from vt_envs.domains.search.index import manifest_of, seal

    dense = DenseRetriever(small_corpus, HashingEmbedder(), cache=tmp_path, progress=False)
    directory = dense.index_path.parent
    embeddings = directory / "embeddings.npy"
    key = dense._cache_key()
    marker = tmp_path / "unpickled"
    np.save(embeddings, np.array([_Planted(marker)], dtype=object), allow_pickle=True)
    seal(manifest_of(embeddings), [embeddings], key)  # whoever planted it sealed it too
    for stale in directory.glob("index-*"):
        stale.unlink()  # so the index is rebuilt from the cached embeddings
    rebuilt = DenseRetriever(small_corpus, HashingEmbedder(), cache=tmp_path, progress=False)
    assert not marker.exists()
    assert _titles(rebuilt, "Danube river Austria")[0] == "Vienna"
    assert rebuilt.embeddings().dtype == np.float32


def test_a_manifest_names_its_key_files_sizes_and_digests(tmp_path, monkeypatch):
    from vt_envs.domains.search.index import manifest_of, publish, unsealed

    path = tmp_path / "entry.json"
    key = {"corpus": "abc", "n": 3}
    publish(path, lambda tmp: tmp.write_text('["a", "b"]'), key, lambda tmp: None)
    manifest = manifest_of(path)
    assert unsealed(manifest, [path], key) is None
    assert "built for" in unsealed(manifest, [path], {**key, "n": 4})
    assert "lists" in unsealed(manifest, [path, tmp_path / "other"], key)
    path.write_text('["a", "c"]')  # same size, other bytes
    assert "SHA-256" in unsealed(manifest, [path], key)
    path.write_text('["a"]')
    assert "bytes, not" in unsealed(manifest, [path], key)
    manifest.unlink()
    assert "no manifest" in unsealed(manifest, [path], key)
    manifest.write_text("{ not json")
    assert "unreadable" in unsealed(manifest, [path], key)


def test_verify_by_stat_skips_hashing_a_file_left_as_sealed(tmp_path, monkeypatch):
    from vt_envs.domains.search import index as index_module

    path = tmp_path / "big.bin"
    key = {"k": 1}
    index_module.publish(path, lambda tmp: tmp.write_bytes(bytes(4096)), key, lambda tmp: None)
    hashed = []
    real = index_module._sha256
    monkeypatch.setattr(index_module, "_sha256", lambda p: hashed.append(p) or real(p))
    manifest = index_module.manifest_of(path)
    assert index_module.unsealed(manifest, [path], key) is None and len(hashed) == 1
    monkeypatch.setenv("VT_CACHE_VERIFY", "stat")
    assert index_module.unsealed(manifest, [path], key) is None and len(hashed) == 1
    sealed = path.stat()
    with path.open("r+b") as f:  # rewritten in place, the same size ...
        f.seek(200)
        f.write(b"\x01")
    os.utime(path, ns=(sealed.st_atime_ns, sealed.st_mtime_ns))  # ... its mtime put back:
    assert index_module.unsealed(manifest, [path], key) is None  # the documented gap
    os.utime(path, ns=(sealed.st_atime_ns, sealed.st_mtime_ns + 10**9))  # a write 1 s later
    assert "SHA-256" in index_module.unsealed(manifest, [path], key)
    monkeypatch.delenv("VT_CACHE_VERIFY")
    os.utime(path, ns=(sealed.st_atime_ns, sealed.st_mtime_ns))
    assert "SHA-256" in index_module.unsealed(manifest, [path], key)  # the default hashes
