"""A cheap lexical embedder for the search unit tests."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np


class HashingEmbedder:
    """Bag-of-words feature hashing, L2-normalized: a deterministic lexical embedder."""

    def __init__(self, dim: int = 512, id: str = "hashing-512"):
        self.dim, self.id = dim, id
        self.calls: list[int] = []  # batch size of every encode call

    def encode(self, texts: Sequence[str], *, kind: str = "query") -> np.ndarray:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)
