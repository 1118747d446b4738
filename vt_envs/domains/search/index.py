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
temporary name and renamed, so a crash never leaves half a cache.

Every cache entry is sealed: a manifest next to it (``NAME.manifest.json``; a
directory entry holds ``manifest.json``) records what it was built from (its
build key: corpus hash, embedder id, dimension, count, index configuration)
and each file's size and SHA-256. An entry is used only if its manifest is
there, names the key being asked for, and every file has its recorded size
and digest; otherwise it is removed and rebuilt, with a warning naming why
(a truncated or bit-flipped file, a file replaced by another entry's, an entry
from before manifests). Nothing in a cache is ever unpickled
(``allow_pickle=False`` throughout). Verifying costs a read of each file at
load: about 20 ms for the default corpus's 15 MB embeddings and 15 MB flat
index, i.e. ~0.7 s per GB; ``$VT_CACHE_VERIFY=stat`` trusts a file whose size,
mtime and inode are the ones recorded when it was sealed instead (for
multi-GB indexes; a change through the file system is still caught, a
same-size rewrite that restores the mtime is not). The manifest guards
against corruption and mix-ups, not against someone who can write the cache
directory (they can rewrite a manifest too): keep the cache directory as
private as the code. Cached and
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from vt_envs.core.cache import vt_cache_root
from vt_envs.errors import InvalidConfigError

__all__ = [
    "INDEX_KINDS",
    "IndexConfig",
    "build_index",
    "cache_dir",
    "cached_array",
    "manifest_of",
    "open_index",
    "publish",
    "seal",
    "unsealed",
    "write_atomically",
]

T = TypeVar("T")

#: What a manifest holds (bumped when its layout changes: older entries are rebuilt).
MANIFEST_FORMAT = 1

INDEX_KINDS = ("flat", "hnsw", "ivf")

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where embeddings and indexes live: ``$VT_CACHE_DIR/search`` (``~/.cache/vt_envs/search``)."""
    return vt_cache_root() / "search"


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


def manifest_of(path: Path) -> Path:
    """Where the manifest of the cache file ``path`` lives (next to it)."""
    return path.with_name(path.name + ".manifest.json")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stat(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ino]


def seal(manifest: Path, files: Sequence[Path], key: Mapping[str, Any]) -> None:
    """Write ``manifest``: the build ``key`` and each of ``files``' size and SHA-256
    (listed by name; a file may still have a temporary name, see :func:`publish`)."""
    _write_manifest(manifest, {f.name: f for f in files}, key)


def _write_manifest(manifest: Path, files: Mapping[str, Path], key: Mapping[str, Any]) -> None:
    entries = {
        name: {"size": f.stat().st_size, "sha256": _sha256(f), "stat": _stat(f)}
        for name, f in files.items()
    }
    record = {"format": MANIFEST_FORMAT, "key": dict(key), "files": entries}
    write_atomically(manifest, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))


def publish(
    path: Path, write: Callable[[Path], None], key: Mapping[str, Any], open_: Callable[[Path], T]
) -> T:
    """Write a cache file and its manifest; return ``open_`` of what was written.

    ``write(tmp)`` writes to a temporary name; it is opened there (a memory map
    follows the file, not its name), sealed under its final name, then renamed
    into place: a process that judges the entry meanwhile at worst rebuilds it,
    and never makes this one read a file it removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        opened = open_(tmp)
        _write_manifest(manifest_of(path), {path.name: tmp}, key)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return opened


def unsealed(manifest: Path, files: Sequence[Path], key: Mapping[str, Any]) -> str | None:
    """Why the entry of ``files`` may not be used (``None``: it may).

    It may when ``manifest`` exists, is for ``key``, lists exactly ``files``, and
    each file has its recorded size and SHA-256 (or, with
    ``$VT_CACHE_VERIFY=stat``, its recorded size, mtime and inode).
    """
    try:
        record = json.loads(manifest.read_text(encoding="utf-8"))
        listed = record["files"]
        if record.get("format") != MANIFEST_FORMAT or not isinstance(listed, dict):
            return "its manifest has another format"
    except FileNotFoundError:
        return "it has no manifest (written before manifests, or not finished)"
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"its manifest is unreadable ({exc!r})"
    if record.get("key") != json.loads(json.dumps(dict(key))):
        return f"it was built for {record.get('key')!r}, not {dict(key)!r}"
    if sorted(listed) != sorted(f.name for f in files):
        return f"its manifest lists {sorted(listed)}, not {sorted(f.name for f in files)}"
    by_stat = os.environ.get("VT_CACHE_VERIFY", "digest") == "stat"
    for path in files:
        entry = listed[path.name]
        try:
            if path.stat().st_size != entry.get("size"):
                return f"{path.name} has {path.stat().st_size} bytes, not {entry.get('size')}"
            if by_stat and _stat(path) == entry.get("stat"):
                continue
            if _sha256(path) != entry.get("sha256"):
                return f"{path.name}'s SHA-256 is not the one recorded"
        except OSError as exc:
            return f"{path.name} is unreadable ({exc})"
    return None


def cached_array(
    path: Path, compute: Callable[[], np.ndarray], key: Mapping[str, Any]
) -> np.ndarray:
    """``np.load(path, mmap_mode="r")`` if cached and sealed for ``key``, else compute,
    save atomically, seal and load.

    A cached file that fails its manifest (see :func:`unsealed`) or cannot be
    read is rebuilt, with a warning. Never unpickles.
    """
    if path.is_file():
        reason = unsealed(manifest_of(path), [path], key)
        if reason is None:
            try:
                return _load_npy(path)
            except (ValueError, OSError, EOFError) as exc:
                reason = f"it is unreadable ({exc})"
        _discard(path, reason)
    array = np.ascontiguousarray(compute())
    return publish(path, lambda tmp: _save_npy(tmp, array), key, _load_npy)


def _load_npy(path: Path) -> np.ndarray:
    return np.load(path, mmap_mode="r", allow_pickle=False)


def _discard(path: Path, reason: str, *others: Path) -> None:
    logger.warning("the cached %s cannot be used: %s; rebuilding it", path, reason)
    for stale in (path, *others, manifest_of(path)):
        stale.unlink(missing_ok=True)


def _save_npy(tmp: Path, array: np.ndarray) -> None:
    with tmp.open("wb") as f:
        np.save(f, array)


def cached_index(
    directory: Path,
    vectors: Callable[[], np.ndarray],
    n: int,
    config: IndexConfig,
    key: Mapping[str, Any],
) -> tuple[object, Path, float]:
    """Open (building first if needed) the index of ``config`` cached in ``directory``.

    ``key`` says what the vectors are (corpus, embedder...); the entry is sealed
    for it and ``config`` (see :func:`unsealed`). Returns ``(index, path,
    build_seconds)``; ``build_seconds`` is 0 on a cache hit.
    """
    import faiss

    path = directory / f"index-{config.cache_name(n)}.faiss"
    meta_path = directory / f"{path.name}.json"  # (build facts for people; never read)
    key = {**key, "index": config.cache_name(n), "ntotal": n}
    seconds = 0.0
    if path.is_file():
        reason = unsealed(manifest_of(path), [path], key)
        if reason is None:
            try:
                index = open_index(path)
                if index.ntotal == n:
                    apply_search_params(index, config)
                    return index, path, seconds
                reason = f"it holds {index.ntotal} vectors, not {n}"
            except InvalidConfigError as exc:
                reason = f"it is unreadable ({exc})"
        _discard(path, reason, meta_path)
    start = time.perf_counter()
    index = build_index(np.asarray(vectors()), config)
    seconds = time.perf_counter() - start
    meta = {"build_s": seconds, "ntotal": n, **dataclasses.asdict(config)}
    write_atomically(meta_path, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))
    index = publish(path, lambda tmp: faiss.write_index(index, str(tmp)), key, open_index)
    apply_search_params(index, config)
    return index, path, seconds


def cache_key(*parts: str) -> str:
    """A short, filesystem-safe directory name for ``parts``."""
    readable = "-".join("".join(c if c.isalnum() else "_" for c in p)[:40] for p in parts)
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:10]
    return f"{readable}-{digest}"
