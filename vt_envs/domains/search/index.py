"""FAISS indexes over normalized embeddings: build, cache on disk, open memory-mapped.

Inner product over unit vectors (cosine similarity), in one of three kinds:

- ``"flat"`` (default): exact search, ``IndexFlatIP``;
- ``"hnsw"``: a graph index (``IndexHNSWFlat``), ``hnsw_m`` links per node,
  ``ef_search`` candidates per query;
- ``"ivf"``: ``IndexIVFFlat``, ``ivf_nlist`` k-means cells (default
  ``4·√n``), ``ivf_nprobe`` cells searched per query.

Embeddings and indexes are cached under ``$VT_CACHE_DIR/search`` (or
``~/.cache/vt_envs/search``) in a directory keyed by the corpus hash and the
embedder id, one index file per index configuration; files are written to a
temporary name and renamed, so a crash never leaves half a cache. Cached and
user-supplied index files are opened with FAISS's memory-mapping flag for
flat codes (``IO_FLAG_MMAP_IFC``; plain ``IO_FLAG_MMAP`` still copies a flat
index into RAM), so processes that open one file share one copy in the page
cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vt_envs.errors import InvalidConfigError

__all__ = [
    "INDEX_KINDS",
    "IndexConfig",
    "build_index",
    "cache_dir",
    "cached_array",
    "open_index",
    "write_atomically",
]

INDEX_KINDS = ("flat", "hnsw", "ivf")

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where embeddings and indexes live: ``$VT_CACHE_DIR/search`` (``~/.cache/vt_envs/search``)."""
    root = os.environ.get("VT_CACHE_DIR") or Path.home() / ".cache" / "vt_envs"
    return Path(root) / "search"


@dataclass(frozen=True)
class IndexConfig:
    """Which FAISS index to build, and its search-time knobs.

    ``ef_search`` and ``ivf_nprobe`` are applied when the index is opened and
    are not part of its cache key (changing them needs no rebuild).
    """

    kind: str = "flat"
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    ef_search: int = 64
    ivf_nlist: int | None = None
    ivf_nprobe: int = 16

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise InvalidConfigError(f"index kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        for name in ("hnsw_m", "hnsw_ef_construction", "ef_search", "ivf_nprobe"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"IndexConfig.{name} must be >= 1")

    @classmethod
    def coerce(cls, value: IndexConfig | str | dict | None) -> IndexConfig:
        if value is None:
            return cls()
        if isinstance(value, IndexConfig):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise InvalidConfigError(
                    f"unknown IndexConfig field(s) {unknown}; known: {sorted(known)}"
                )
            return cls(**value)
        raise InvalidConfigError(
            f"index must be a kind name, a dict or an IndexConfig, got {value!r}"
        )

    def nlist(self, n: int) -> int:
        return self.ivf_nlist or max(1, min(n // 39, int(4 * math.sqrt(n))))

    def describe(self, n: int) -> str:
        """Build and search parameters (what changes results): for names and cache keys."""
        if self.kind == "hnsw":
            return f"{self.cache_name(n)}-ef{self.ef_search}"
        if self.kind == "ivf":
            return f"{self.cache_name(n)}-nprobe{self.ivf_nprobe}"
        return self.cache_name(n)

    def cache_name(self, n: int) -> str:
        if self.kind == "flat":
            return "flat"
        if self.kind == "hnsw":
            return f"hnsw-m{self.hnsw_m}-efc{self.hnsw_ef_construction}"
        return f"ivf-{self.nlist(n)}"


def build_index(vectors: np.ndarray, config: IndexConfig) -> object:
    """A FAISS inner-product index of ``config.kind`` holding ``vectors`` (row i = id i)."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    if config.kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif config.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    else:
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, config.nlist(n), faiss.METRIC_INNER_PRODUCT)
        # k-means on a sample is as good as on everything past ~256 points a cell.
        sample = vectors
        if n > 256 * index.nlist:
            rng = np.random.default_rng(0)
            sample = vectors[rng.choice(n, 256 * index.nlist, replace=False)]
        index.train(sample)
    index.add(vectors)
    apply_search_params(index, config)
    return index


def apply_search_params(index: object, config: IndexConfig) -> None:
    """Set ``efSearch`` / ``nprobe`` on an index of the matching kind."""
    import faiss

    base = faiss.downcast_index(index)
    if isinstance(base, faiss.IndexHNSW):
        base.hnsw.efSearch = config.ef_search
    elif isinstance(base, faiss.IndexIVF):
        base.nprobe = config.ivf_nprobe


def open_index(path: str | os.PathLike[str], *, mmap: bool = True) -> object:
    """Read a FAISS index file, memory-mapped by default (shared between processes).

    Raises :class:`InvalidConfigError` naming the file when it is missing or
    not a readable FAISS index (truncated, another format).
    """
    import faiss

    path = Path(path)
    if not path.is_file():
        raise InvalidConfigError(f"FAISS index file {str(path)!r} does not exist")
    flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidConfigError(
            f"{str(path)!r} is not a readable FAISS index ({first}); rebuild it or pass "
            "the file faiss.write_index wrote"
        ) from None


def write_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` then rename ``tmp`` to ``path`` (a crash leaves no partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def cached_array(path: Path, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """``np.load(path, mmap_mode="r")`` if cached, else compute, save atomically and load.

    A cached file that cannot be read (truncated by a full disk...) is
    rebuilt, with a warning.
    """
    if path.is_file():
        try:
            return np.load(path, mmap_mode="r")
        except (ValueError, OSError, EOFError) as exc:
            _discard(path, exc)
    array = np.ascontiguousarray(compute())
    write_atomically(path, lambda tmp: _save_npy(tmp, array))
    return np.load(path, mmap_mode="r")


def _discard(path: Path, exc: BaseException) -> None:
    logger.warning("the cached %s is unreadable (%s); rebuilding it", path, exc)
    path.unlink(missing_ok=True)


def _save_npy(tmp: Path, array: np.ndarray) -> None:
    with tmp.open("wb") as f:
        np.save(f, array)


def cached_index(
    directory: Path, vectors: Callable[[], np.ndarray], n: int, config: IndexConfig
) -> tuple[object, Path, float]:
    """Open (building first if needed) the index of ``config`` cached in ``directory``.

    Returns ``(index, path, build_seconds)``; ``build_seconds`` is 0 on a cache hit.
    """
    import faiss

    path = directory / f"index-{config.cache_name(n)}.faiss"
    seconds = 0.0
    if path.is_file():
        try:
            index = open_index(path)
            if index.ntotal == n:
                apply_search_params(index, config)
                return index, path, seconds
            _discard(path, ValueError(f"it holds {index.ntotal} vectors, not {n}"))
        except InvalidConfigError as exc:
            _discard(path, exc)
    start = time.perf_counter()
    index = build_index(np.asarray(vectors()), config)
    seconds = time.perf_counter() - start
    write_atomically(path, lambda tmp: faiss.write_index(index, str(tmp)))
    meta = {"build_s": seconds, "ntotal": n, **dataclasses.asdict(config)}
    _write_meta(directory, path.name, meta)
    index = open_index(path)
    apply_search_params(index, config)
    return index, path, seconds


def _write_meta(directory: Path, name: str, meta: dict) -> None:
    meta_path = directory / f"{name}.json"
    write_atomically(meta_path, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))


def cache_key(*parts: str) -> str:
    """A short, filesystem-safe directory name for ``parts``."""
    readable = "-".join("".join(c if c.isalnum() else "_" for c in p)[:40] for p in parts)
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:10]
    return f"{readable}-{digest}"
