"""Spaces that describe text observations and actions honestly.

Gymnasium's :class:`~gymnasium.spaces.Text` only contains strings drawn from
a fixed charset (alphanumeric by default), but tool output and policy text
are arbitrary unicode. :class:`UnicodeText` contains any ``str`` within its
length bounds; it samples from a mixed charset (letters, digits, tags,
punctuation, whitespace, non-ASCII) so that random actions exercise parsers.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["UnicodeText", "token_sequence_space"]

SAMPLE_MAX_LENGTH = 64
_SAMPLE_CHARSET = string.ascii_letters + string.digits + ' \n<>/{}":,._-=()+*éßλ中🙂'


class UnicodeText(spaces.Text):
    """Any ``str`` of ``min_length`` to ``max_length`` characters (unicode)."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of at most :data:`SAMPLE_MAX_LENGTH` characters.

        Samples stay short (the space itself admits up to ``max_length``) so
        random-action checks exercise the parser, not the token budget.
        """
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        high = min(self.max_length, SAMPLE_MAX_LENGTH)
        length = int(self.np_random.integers(self.min_length, high + 1))
        chars = self.np_random.choice(len(_SAMPLE_CHARSET), size=length)
        return "".join(_SAMPLE_CHARSET[i] for i in chars)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


def token_sequence_space(vocab_size: int, seed: Any = None) -> spaces.Sequence:
    """A variable-length 1-D ``int64`` array of token ids in ``[0, vocab_size)``."""
    return spaces.Sequence(spaces.Discrete(vocab_size, seed=seed), stack=True, seed=seed)


def empty_tokens() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)
