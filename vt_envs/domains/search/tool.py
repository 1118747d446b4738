"""The former name of :mod:`vt_envs.domains.search.tools` (a domain's tools live in
``tools.py``), kept until every import uses the new one."""

from __future__ import annotations

from vt_envs.domains.search.tools import MAX_QUERY_CHARS, SearchTool, format_passages

__all__ = ["MAX_QUERY_CHARS", "SearchTool", "format_passages"]
