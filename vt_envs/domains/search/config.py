"""VT-Search-v0 declared: its keywords (:class:`SearchConfig`) and how its parts are built.

The tools and the generated tasks share one retriever (:func:`shared_retriever`:
one index and one encoder per process); a config resolves it once, so an env's
tools and tasks use the same object.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vt_envs.core.domain import Domain
from vt_envs.core.task import TaskSource
from vt_envs.domains.search.corpus import Corpus, as_corpus
from vt_envs.domains.search.embedders import Embedder, load_embedder
from vt_envs.domains.search.examples import EXAMPLES
from vt_envs.domains.search.index import IndexConfig
from vt_envs.domains.search.loaders import load_fanoutqa, load_search_r1
from vt_envs.domains.search.retriever import Retriever, shared_retriever
from vt_envs.domains.search.tasks import TASK_KINDS, search_tasks
from vt_envs.domains.search.tools import SearchTool
from vt_envs.domains.search.verifier import AnswerMatch
from vt_envs.errors import InvalidConfigError

__all__ = ["INSTRUCTIONS", "SEARCH", "SearchConfig"]

logger = logging.getLogger("vt_envs.domains.search")

INSTRUCTIONS = (
    "Answer the question using the knowledge base. Reason step by step; whenever you lack "
    "a fact, search for it: the top passages come back between <information> and "
    "</information>, and you may search again as often as you need. Give only the answer "
    "itself as the final answer (a name, a year, a word), for example <answer>Beijing</answer>."
)


@dataclass(frozen=True)
class SearchConfig:
    """VT-Search-v0's own keywords.

    Args:
        split: ``"train"`` or ``"test"`` (the fixed held-out articles).
        retriever: ``"auto"`` (dense if the ``search`` extra is installed, else
            BM25 with a one-time message), ``"dense"`` or ``"bm25"``.
        index: FAISS index of the dense retriever: ``"flat"`` (exact),
            ``"hnsw"``, ``"ivf"``, or an :class:`IndexConfig` / dict of its fields.
        corpus: ``None`` (the embedded Wikipedia summaries), a :class:`Corpus`,
            or a path to a Search-R1 corpus JSONL.
        index_path: a prebuilt FAISS index of ``corpus`` (opened memory-mapped).
        embedder: ``None`` (all-MiniLM-L6-v2), a sentence-transformers model
            directory, or an :class:`Embedder`.
        query_prefix: text put before each query the embedder embeds
            (``"query: "`` for e5).
        top_k: passages per search.
        passage_words: cut each shown passage to this many words (``None``:
            whole passages).
        max_searches: searches per episode (then only an answer is accepted).
        search_timeout_s: deadline of one search.
        kinds, size: which generated task kinds, and at most how many tasks.
        dataset: instead of generated tasks, a Search-R1 / FlashRAG question
            file, or ``"fanoutqa"``.
        metric: the reward: ``"em"``, ``"f1"`` or ``"substring_em"``.
        examples: worked examples before the task; ``None``: the two of
            :mod:`vt_envs.domains.search.examples` over the embedded corpus
            (none with ``corpus=``/``dataset=``: they are about the embedded
            articles); ``[]``: none.
    """

    split: str = "train"
    retriever: str = "auto"
    index: str | dict | IndexConfig = "flat"
    corpus: Corpus | str | os.PathLike[str] | None = None
    index_path: str | os.PathLike[str] | None = None
    embedder: Embedder | str | os.PathLike[str] | None = None
    query_prefix: str = ""
    top_k: int = 3
    passage_words: int | None = None
    max_searches: int | None = 4
    search_timeout_s: float = 30.0
    kinds: Sequence[str] = TASK_KINDS
    size: int | None = None
    dataset: str | None = None
    metric: str = "em"
    examples: Any = None

    def __post_init__(self) -> None:
        top_k, size, kinds = self.top_k, self.size, self.kinds
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise InvalidConfigError(f"top_k must be an int >= 1, got {top_k!r}")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise InvalidConfigError(f"size must be None or an int >= 1, got {size!r}")
        if isinstance(kinds, str) or not all(k in TASK_KINDS for k in kinds):
            raise InvalidConfigError(
                f"kinds must be a list of task kinds from {list(TASK_KINDS)}, got {kinds!r}"
            )
        timeout = self.search_timeout_s
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise InvalidConfigError(f"search_timeout_s must be > 0, got {timeout!r}")

    @functools.cached_property
    def shared(self) -> Retriever:
        """The process-wide retriever these keywords name (resolved once per config,
        so the tools and the tasks built from it share it)."""
        embedder = self.embedder
        if embedder is not None and not isinstance(embedder, Embedder):
            embedder = load_embedder(embedder, query_prefix=self.query_prefix)
        shared = shared_retriever(
            self.retriever,
            as_corpus(self.corpus),
            embedder=embedder,
            index=self.index,
            index_path=self.index_path,
        )
        if shared.name == "bm25" and (
            self.index_path is not None or self.index not in (None, "flat")
        ):
            logger.warning(
                "VT-Search-v0: index=%r / index_path=%r do not apply to BM25",
                self.index,
                self.index_path,
            )
        return shared


def tools(config: SearchConfig) -> list[SearchTool]:
    """The ``search`` tool over the shared retriever."""
    return [
        SearchTool(
            config.shared,
            top_k=config.top_k,
            passage_words=config.passage_words,
            timeout_s=config.search_timeout_s,
        )
    ]


def tasks(config: SearchConfig) -> TaskSource:
    """Tasks generated from the corpus (with the shared retriever), or a user's
    Search-R1 / FlashRAG question file, or FanOutQA."""
    shared = config.shared  # resolved first, whichever task source: the index is built
    if config.dataset is None:
        return search_tasks(
            config.split, retriever=shared, top_k=config.top_k, kinds=config.kinds, size=config.size
        )
    if config.dataset == "fanoutqa":
        return load_fanoutqa("dev")
    if not os.path.exists(config.dataset):
        raise InvalidConfigError(
            "dataset must be 'fanoutqa' or a path to a Search-R1 question file, "
            f"got {config.dataset!r}"
        )
    return load_search_r1(config.dataset, split=config.split)


def verifier(config: SearchConfig) -> AnswerMatch:
    """Exact match after SQuAD normalization (or ``metric``'s)."""
    return AnswerMatch(config.metric)


def env_kwargs(config: SearchConfig) -> dict[str, Any]:
    """``max_tool_calls`` (this id's ``max_searches``) and the worked examples (the
    search ones over the embedded corpus, none with ``corpus=``/``dataset=``)."""
    embedded = config.corpus is None and config.dataset is None
    return {
        "max_tool_calls": config.max_searches,
        "examples": EXAMPLES if config.examples is None and embedded else config.examples,
    }


SEARCH: Domain[SearchConfig] = Domain(
    id="VT-Search-v0",
    config=SearchConfig,
    tools=tools,
    tasks=tasks,
    verifier=verifier,
    instructions=INSTRUCTIONS,
    episode={"max_turns": 6, "max_episode_tokens": 8192, "max_observation_tokens": 1024},
    env_kwargs=env_kwargs,
    renamed={"max_tool_calls": "max_searches"},
)
