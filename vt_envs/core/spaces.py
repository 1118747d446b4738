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

__all__ = ["ImageSequence", "UnicodeText", "token_sequence_space"]

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


class ImageSequence(spaces.Space[tuple]):
    """A tuple of RGB images: each an ``HxWx3`` ``uint8`` array of any size up to ``max_side``.

    Gymnasium's :class:`~gymnasium.spaces.Box` has one fixed shape, but an
    episode's images (the task's, then crops and zooms) differ in size and
    number. ``sample`` gives 0 to 2 small random images.
    """

    def __init__(self, max_side: int, *, max_images: int | None = None, seed: Any = None):
        super().__init__(shape=None, dtype=np.uint8, seed=seed)
        self.max_side, self.max_images = int(max_side), max_images

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> tuple[np.ndarray, ...]:
        count = int(self.np_random.integers(0, 3))
        sides = self.np_random.integers(1, min(self.max_side, 64) + 1, size=(count, 2))
        return tuple(
            self.np_random.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in sides
        )

    def contains(self, x: Any) -> bool:
        if not isinstance(x, tuple) or (self.max_images is not None and len(x) > self.max_images):
            return False
        return all(
            isinstance(image, np.ndarray)
            and image.dtype == np.uint8
            and image.ndim == 3
            and image.shape[2] == 3
            and 1 <= image.shape[0] <= self.max_side
            and 1 <= image.shape[1] <= self.max_side
            for image in x
        )

    def __repr__(self) -> str:
        return f"ImageSequence(max_side={self.max_side}, max_images={self.max_images})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ImageSequence)
            and self.max_side == other.max_side
            and self.max_images == other.max_images
        )


def token_sequence_space(vocab_size: int, seed: Any = None) -> spaces.Sequence:
    """A variable-length 1-D ``int64`` array of token ids in ``[0, vocab_size)``."""
    return spaces.Sequence(spaces.Discrete(vocab_size, seed=seed), stack=True, seed=seed)


def empty_tokens() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)
