"""VT-Search-v0: retrieval-augmented question answering over an embedded FAISS index.

The agent searches with ``<search>QUERY</search>`` (or a ``search`` JSON
tool call), reads the top-k passages as ``Doc i (Title: T) text`` inside an
``<information>`` block, may search again, and answers with
``<answer>…</answer>``. The reward is exact match after SQuAD normalization
against any gold answer (``metric="f1"`` or ``"substring_em"`` instead; all
three are in ``info["verifier_parts"]``).

Retrieval is embedded, CPU-only and shared: :func:`shared_retriever` loads
one index and one encoder per process for every env (see
:mod:`~vt_envs.domains.search.retriever`). ``retriever="dense"`` is
all-MiniLM-L6-v2 + FAISS (the ``search`` extra); ``"bm25"`` is ``bm25s``;
``"auto"`` (default) takes dense when the extra is installed.

Tasks are generated from the corpus (:func:`search_tasks`: masked-subject,
year-cloze and three multi-hop kinds, kept when both retrievers find every
hop's passage and, held out, when a closed-book model cannot answer them; the
same set whichever retriever the env uses), or come from a Search-R1 / FlashRAG file
(``dataset="nq_test.parquet"``) or FanOutQA (``dataset="fanoutqa"``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from vt_envs.core.env import ToolEnv
from vt_envs.core.task import TaskSource
from vt_envs.domains.search.corpus import (
    Corpus,
    Passage,
    as_corpus,
    load_search_r1_corpus,
    vital_articles_corpus,
)
from vt_envs.domains.search.embedders import (
    Embedder,
    SentenceTransformerEmbedder,
    default_embedder,
    dense_available,
    load_embedder,
)
from vt_envs.domains.search.examples import EXAMPLES
from vt_envs.domains.search.index import INDEX_KINDS, IndexConfig, build_index, open_index
from vt_envs.domains.search.loaders import fanoutqa_coverage, load_fanoutqa, load_search_r1
from vt_envs.domains.search.oracle import NoSearchPolicy, SearchOracle
from vt_envs.domains.search.retriever import (
    BM25Retriever,
    DenseRetriever,
    Hit,
    Retriever,
    shared_retriever,
)
from vt_envs.domains.search.tasks import TASK_KINDS, candidate_tasks, search_tasks
from vt_envs.domains.search.tool import SearchTool, format_passages
from vt_envs.domains.search.verifier import AnswerMatch, normalize_answer
from vt_envs.errors import InvalidConfigError
from vt_envs.tools.builder import env_builder

__all__ = [
    "INDEX_KINDS",
    "INSTRUCTIONS",
    "TASK_KINDS",
    "AnswerMatch",
    "BM25Retriever",
    "Corpus",
    "DenseRetriever",
    "Embedder",
    "Hit",
    "IndexConfig",
    "NoSearchPolicy",
    "Passage",
    "Retriever",
    "SearchOracle",
    "SearchTool",
    "SentenceTransformerEmbedder",
    "build_index",
    "candidate_tasks",
    "default_embedder",
    "dense_available",
    "fanoutqa_coverage",
    "format_passages",
    "load_embedder",
    "load_fanoutqa",
    "load_search_r1",
    "load_search_r1_corpus",
    "make_search_env",
    "normalize_answer",
    "open_index",
    "search_tasks",
    "shared_retriever",
    "vital_articles_corpus",
]

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Answer the question using the knowledge base. Reason step by step; whenever you lack "
    "a fact, search for it: the top passages come back between <information> and "
    "</information>, and you may search again as often as you need. Give only the answer "
    "itself as the final answer (a name, a year, a word), for example <answer>Beijing</answer>."
)


def _embedder(
    embedder: Embedder | str | os.PathLike[str] | None, query_prefix: str
) -> Embedder | None:
    if embedder is None or isinstance(embedder, Embedder):
        return embedder
    return load_embedder(embedder, query_prefix=query_prefix)


def _dataset_tasks(dataset: str, split: str, corpus: Corpus) -> TaskSource:
    if dataset == "fanoutqa":
        return load_fanoutqa("dev")
    if not os.path.exists(dataset):
        raise InvalidConfigError(
            f"dataset must be 'fanoutqa' or a path to a Search-R1 question file, got {dataset!r}"
        )
    return load_search_r1(dataset, split=split)


def _check_options(*, top_k: Any, size: Any, kinds: Any, search_timeout_s: Any) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InvalidConfigError(f"top_k must be an int >= 1, got {top_k!r}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise InvalidConfigError(f"size must be None or an int >= 1, got {size!r}")
    if isinstance(kinds, str) or not all(k in TASK_KINDS for k in kinds):
        raise InvalidConfigError(
            f"kinds must be a list of task kinds from {list(TASK_KINDS)}, got {kinds!r}"
        )
    if not isinstance(search_timeout_s, (int, float)) or search_timeout_s <= 0:
        raise InvalidConfigError(f"search_timeout_s must be > 0, got {search_timeout_s!r}")


@env_builder(renamed={"max_tool_calls": "max_searches"})
def make_search_env(
    *,
    split: str = "train",
    retriever: str = "auto",
    index: str | dict | IndexConfig = "flat",
    corpus: Corpus | str | os.PathLike[str] | None = None,
    index_path: str | os.PathLike[str] | None = None,
    embedder: Embedder | str | os.PathLike[str] | None = None,
    query_prefix: str = "",
    top_k: int = 3,
    passage_words: int | None = None,
    max_searches: int | None = 4,
    search_timeout_s: float = 30.0,
    kinds: Sequence[str] = TASK_KINDS,
    size: int | None = None,
    dataset: str | None = None,
    metric: str = "em",
    max_turns: int = 6,
    max_episode_tokens: int = 8192,
    max_observation_tokens: int = 1024,
    examples: Any = None,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build VT-Search-v0.

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
        max_turns, max_episode_tokens, max_observation_tokens, **env_kwargs:
            passed to :class:`ToolEnv`.
    """
    _check_options(top_k=top_k, size=size, kinds=kinds, search_timeout_s=search_timeout_s)
    passages = as_corpus(corpus)
    shared = shared_retriever(
        retriever,
        passages,
        embedder=_embedder(embedder, query_prefix),
        index=index,
        index_path=index_path,
    )
    if shared.name == "bm25" and (index_path is not None or index not in (None, "flat")):
        logger.warning(
            "VT-Search-v0: index=%r / index_path=%r do not apply to BM25", index, index_path
        )
    if dataset is not None:
        tasks = _dataset_tasks(dataset, split, passages)
    else:
        tasks = search_tasks(split, retriever=shared, top_k=top_k, kinds=kinds, size=size)
    return ToolEnv(
        tools=[
            SearchTool(shared, top_k=top_k, passage_words=passage_words, timeout_s=search_timeout_s)
        ],
        tasks=tasks,
        verifier=AnswerMatch(metric),
        instructions=INSTRUCTIONS,
        max_turns=max_turns,
        max_tool_calls=max_searches,
        max_episode_tokens=max_episode_tokens,
        max_observation_tokens=max_observation_tokens,
        examples=EXAMPLES if examples is None and corpus is None and dataset is None else examples,
        name="VT-Search-v0",
        **env_kwargs,
    )
