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

from vt_envs.domains.search.config import INSTRUCTIONS, SEARCH, SearchConfig
from vt_envs.domains.search.corpus import (
    Corpus,
    Passage,
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
from vt_envs.domains.search.tools import SearchTool, format_passages
from vt_envs.domains.search.verifier import AnswerMatch, normalize_answer
from vt_envs.tools.builder import domain_builder

__all__ = [
    "INDEX_KINDS",
    "INSTRUCTIONS",
    "SEARCH",
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
    "SearchConfig",
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

make_search_env = domain_builder(SEARCH, name="make_search_env", module=__name__)
