"""The images of a :class:`~vt_envs.core.env.ToolEnv` episode.

An env made with ``task_images`` is an image env: the task's images open the
episode, tool results may add more (``ToolResult.images``), and each image
sits in the text as :data:`~vt_envs.core.tokenizer.IMAGE_MARK` until the
encoder expands it. Every helper here is a no-op for a text env (one whose
``image_tokens`` is ``None``): no images, no image tokens, text unchanged.

Images are held by reference, never copied: :func:`frozen_image` returns the
array itself, or a read-only view of it, unless its dtype or layout must change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vt_envs.core.image_tokens import ImageTokens
from vt_envs.core.task import Task
from vt_envs.core.tokenizer import IMAGE_MARK, IMAGE_TOKEN
from vt_envs.errors import InvalidConfigError

__all__ = [
    "BLANK_FRAME",
    "MAX_IMAGE_SIDE",
    "check_image_budget",
    "collapse_images",
    "count_image_tokens",
    "frozen_image",
    "place_images",
    "public_message",
    "task_images_of",
]

#: What ``render()`` shows in ``rgb_array`` mode when the episode has no image (read-only).
BLANK_FRAME = np.full((64, 64, 3), 255, dtype=np.uint8)
BLANK_FRAME.flags.writeable = False

#: The longest image side the observation space admits.
MAX_IMAGE_SIDE = 8192


def check_image_budget(max_image_tokens: Any, *, image_env: bool) -> None:
    """Refuse a ``max_image_tokens`` that is not ``None`` or an int >= 1, or that is
    given to a text env (``image_env`` false: no ``task_images``)."""
    if not image_env and max_image_tokens is not None:
        raise InvalidConfigError("max_image_tokens= applies to envs with images; give task_images=")
    if max_image_tokens is not None and (
        isinstance(max_image_tokens, bool)
        or not isinstance(max_image_tokens, int)
        or max_image_tokens < 1
    ):
        raise InvalidConfigError(
            f"max_image_tokens must be an int >= 1 or None, got {max_image_tokens!r}"
        )


def task_images_of(
    task: Task, task_images: Callable[[Task], Sequence[np.ndarray]] | None
) -> tuple[np.ndarray, ...]:
    """The task's images, each :func:`frozen_image`; ``()`` in a text env."""
    if task_images is None:
        return ()
    return tuple(frozen_image(image) for image in task_images(task))


def count_image_tokens(images: Sequence[np.ndarray], image_tokens: ImageTokens | None) -> list[int]:
    """The token count of each image, in order; ``[]`` in a text env."""
    if image_tokens is None:
        return []
    return [image_tokens.count(image) for image in images]


def collapse_images(text: str, image_tokens: ImageTokens | None) -> str:
    """``text`` for the ansi transcript: each expanded image back to its placeholder."""
    return text if image_tokens is None else image_tokens.collapse(text)


def public_message(message: Mapping[str, Any], first_image: int) -> dict[str, Any]:
    """A message as ``info`` shows it: a copy, whose content, if it holds image marks,
    becomes a list of parts, ``{"type": "text", "text": ...}`` and ``{"type": "image",
    "index": k}``, ``k`` counting the episode's images from ``first_image``."""
    content = str(message["content"])
    if IMAGE_MARK not in content:
        return dict(message)
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(content.split(IMAGE_MARK)):
        if k:
            parts.append({"type": "image", "index": first_image + k - 1})
        if piece:
            parts.append({"type": "text", "text": piece})
    return {**message, "content": parts}


def place_images(prompt: str, count: int) -> str:
    """The prompt with its first ``count`` ``<image>`` markers as image marks (and marks
    for images beyond the markers, first); further markers stay text."""
    prompt = prompt.replace(IMAGE_MARK, "")
    pieces = prompt.split(IMAGE_TOKEN, count)
    missing = count - (len(pieces) - 1)
    head = (IMAGE_MARK + "\n") * missing
    return head + IMAGE_MARK.join(pieces)


def frozen_image(image: Any) -> np.ndarray:
    """``image`` as a read-only ``HxWx3 uint8`` array: itself if it already is one, else a
    read-only view (no copy) or, for other dtypes and layouts, a converted copy."""
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise InvalidConfigError(
            f"an image must be an HxWx3 uint8 array, got shape {array.shape} ({array.dtype})"
        )
    if array.dtype != np.uint8:
        array = array.astype(np.uint8)
    if array.flags.writeable:
        array = array.view()
        array.setflags(write=False)
    return array
