"""Shortcut baselines of VT-Search-v0, by the names its registration gives them.

``no-search``: :class:`~vt_envs.domains.search.oracle.NoSearchPolicy`, which answers
at once from the question's surface (a year, the most common nationality, or a
name the question holds) and never searches.
"""

from __future__ import annotations

from typing import Any

from vt_envs.domains.search.oracle import NoSearchPolicy

__all__ = ["no_search_shortcut"]


def no_search_shortcut(env: Any = None) -> NoSearchPolicy:
    """Shortcut factory (``factory(env) -> Policy``): :class:`NoSearchPolicy`."""
    return NoSearchPolicy()
