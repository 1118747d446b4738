"""Text hygiene for what policies and tools produce."""

from __future__ import annotations

__all__ = ["valid_utf8"]


def valid_utf8(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates, e.g. from a JSON
    ``"\\ud800"`` escape) replaced by ``?``, so no policy text can crash a tokenizer."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
