"""SearchTool: the agent's query → the top-k passages, as Search-R1 shows them.

``<search>QUERY</search>`` (or ``{"name": "search", "arguments": {"query": ...}}``)
returns::

    <information>Doc 1 (Title: T1) text...
    Doc 2 (Title: T2) text...
    Doc 3 (Title: T3) text...</information>

Stateless and read-only, so calls may run concurrently; every env of a
process shares one :class:`~vt_envs.domains.search.retriever.Retriever`,
whose micro-batcher merges concurrent queries into one encoder call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from vt_envs.core.text import valid_utf8
from vt_envs.core.tool import Tool, ToolResult
from vt_envs.domains.search.retriever import Retriever
from vt_envs.errors import InvalidConfigError

__all__ = ["MAX_QUERY_CHARS", "SearchTool", "format_passages"]

#: Longer queries are cut to this many characters before encoding.
MAX_QUERY_CHARS = 1000


def format_passages(docs: list[tuple[str, str]], passage_words: int | None) -> str:
    """``[(title, text), ...]`` → the ``<information>`` block, texts cut to ``passage_words``."""
    lines = []
    for i, (title, text) in enumerate(docs, 1):
        words = text.split()
        if passage_words is not None and len(words) > passage_words:
            text = " ".join(words[:passage_words]) + " …"
        lines.append(f"Doc {i} (Title: {title}) {text}")
    return "<information>" + "\n".join(lines) + "</information>"


class SearchTool(Tool):
    """Retrieves the top ``top_k`` passages for a query.

    Args:
        retriever: the (shared) retriever over the env's corpus.
        top_k: passages per query.
        passage_words: cut each passage's text to this many words (``None``: whole).
        timeout_s: deadline of one query.
    """

    name = "search"
    description = (
        "Search the knowledge base (Wikipedia summaries) and return the most relevant passages."
    )
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "what to search for"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    tag_argument = "query"
    concurrent_calls = True

    def __init__(
        self,
        retriever: Retriever,
        *,
        top_k: int = 3,
        passage_words: int | None = 100,
        timeout_s: float = 30.0,
    ):
        super().__init__(timeout_s=timeout_s)
        if not isinstance(top_k, int) or top_k < 1:
            raise InvalidConfigError(f"top_k must be an int >= 1, got {top_k!r}")
        if passage_words is not None and passage_words < 1:
            raise InvalidConfigError(f"passage_words must be >= 1 or None, got {passage_words!r}")
        self.retriever, self.top_k, self.passage_words = retriever, top_k, passage_words

    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float
    ) -> ToolResult:
        query = " ".join(valid_utf8(str(arguments["query"])).split())[:MAX_QUERY_CHARS]
        if not query:
            return ToolResult.failure(
                "Error: the search query is empty. Put what you are looking for between "
                "<search> and </search>.",
                "empty_query",
            )
        timeout_s = self.deadline(timeout_s)
        start = time.perf_counter()
        try:
            hits = await asyncio.wait_for(self.retriever.asearch(query, self.top_k), timeout_s)
        except asyncio.TimeoutError:
            return ToolResult.failure(
                f"Error: the search did not finish within {timeout_s:.3g} s.", "timeout"
            )
        if not hits:
            return ToolResult(
                "<information>No passages matched the query.</information>",
                metrics={"hits": 0, "retrieve_s": time.perf_counter() - start},
            )
        corpus = self.retriever.corpus
        docs = [(corpus[h.index].title, corpus[h.index].text) for h in hits]
        return ToolResult(
            format_passages(docs, self.passage_words),
            metrics={"hits": len(hits), "retrieve_s": time.perf_counter() - start},
        )
