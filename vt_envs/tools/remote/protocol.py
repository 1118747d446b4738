"""What travels between :mod:`vt_envs.tools.remote.client` and :mod:`vt_envs.server.app`.

JSON over HTTP. A task travels as a *reference* (:func:`task_ref`): its id and
a digest of its prompt. The server resolves the task in its own env's task
source (the operator's data), so no asset, path or image in a request ever
reaches a tool; the digest catches a client and a server built from
different data. A :class:`ToolResult` travels whole, its images as PNG,
base64, whose size is checked before they are decoded (:data:`MAX_IMAGE_PIXELS`).
Error kinds the client turns into observations are listed in :data:`ERROR_KINDS`.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Mapping
from typing import Any

import numpy as np

from vt_envs.core.task import Task
from vt_envs.core.tool import ToolResult

__all__ = [
    "ERROR_KINDS",
    "MAX_IMAGE_PIXELS",
    "MAX_REPLY_IMAGES",
    "MAX_REPLY_TEXT_CHARS",
    "decode_result",
    "encode_result",
    "prompt_digest",
    "task_ref",
]

#: ``ToolResult.error`` values the client produces for failures of the service itself.
ERROR_KINDS = {
    "tool_server_unreachable": "the tool server could not be reached",
    "tool_server_timeout": "the tool server did not answer before the call's deadline",
    "tool_server_auth": "the tool server refused the token",
    "tool_server_busy": "the tool server had no free call slot before the deadline",
    "session_lost": "the tool server no longer knows this episode's session (it restarted, "
    "or the session's lease expired); the tool's state for this episode is gone",
    "tool_server_error": "the tool server failed while running the call",
    "tool_server_full": "the tool server has no room for another session (its operator "
    "caps sessions in all and per client)",
}

#: The most pixels the images of one reply may have in all; checked from each PNG's
#: header, before decoding (a small PNG can decode to gigabytes).
MAX_IMAGE_PIXELS = 64 << 20
#: The most images one reply may carry.
MAX_REPLY_IMAGES = 16
#: Reply text past this many characters is cut (local tools cap their output far below).
MAX_REPLY_TEXT_CHARS = 256 << 10

_IMAGE = "__vt_image_png__"


def _png(image: np.ndarray) -> dict[str, str]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return {_IMAGE: base64.b64encode(buffer.getvalue()).decode()}


def _png_bytes(data: Any) -> bytes:
    if not isinstance(data, str):
        raise ValueError("an image must be a base64 PNG string")
    return base64.b64decode(data, validate=True)


def _png_pixels(png: bytes) -> int:
    """Width x height from a PNG's header (nothing decoded); ValueError if not a PNG."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        if image.format != "PNG":
            raise ValueError(f"an image in the reply is {image.format}, not PNG")
        width, height = image.size
    return width * height


def _unpng_bytes(png: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        array = np.asarray(image.convert("RGB"))
    array.setflags(write=False)
    return array


def prompt_digest(prompt: str) -> str:
    """The digest a task reference carries of its prompt (sha256, hex)."""
    return hashlib.sha256(prompt.encode("utf-8", errors="surrogatepass")).hexdigest()


def task_ref(task: Task) -> dict[str, str]:
    """What a request says of ``task``: its id and its prompt's digest (nothing else)."""
    return {"id": str(task.id), "prompt_sha256": prompt_digest(str(task.prompt))}


def encode_result(result: ToolResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "images": [_png(i) for i in result.images],
        "ok": result.ok,
        "error": result.error,
        "metrics": {k: float(v) for k, v in result.metrics.items()},
        "ends_episode": result.ends_episode,
    }


def decode_result(data: Any) -> ToolResult:
    """A reply's :class:`ToolResult`, checked field by field and capped (the client trusts
    no server with its memory): text past :data:`MAX_REPLY_TEXT_CHARS` is cut, more than
    :data:`MAX_REPLY_IMAGES` images or :data:`MAX_IMAGE_PIXELS` pixels in all refused.

    Raises:
        ValueError / TypeError / KeyError: a reply that is not the protocol's.
    """
    if not isinstance(data, Mapping):
        raise TypeError("the reply is not a JSON object")
    text, images = data["text"], data.get("images") or []
    if not isinstance(text, str) or not isinstance(images, list):
        raise TypeError("text must be a string and images a list")
    if len(text) > MAX_REPLY_TEXT_CHARS:
        text = text[:MAX_REPLY_TEXT_CHARS] + "\n[... the rest of the reply was cut]"
    if len(images) > MAX_REPLY_IMAGES:
        raise ValueError(f"{len(images)} images; at most {MAX_REPLY_IMAGES} per reply")
    if not all(isinstance(image, Mapping) for image in images):
        raise TypeError("an image must be an object")
    pngs = [_png_bytes(image[_IMAGE]) for image in images]
    pixels = sum(_png_pixels(png) for png in pngs)  # every header, before any decoding
    if pixels > MAX_IMAGE_PIXELS:
        raise ValueError(f"the reply's images have {pixels} pixels; at most {MAX_IMAGE_PIXELS}")
    decoded = [_unpng_bytes(png) for png in pngs]
    metrics = data.get("metrics") or {}
    if not isinstance(metrics, Mapping) or len(metrics) > 64:
        raise ValueError("metrics must be an object of at most 64 numbers")
    return ToolResult(
        text=text,
        images=tuple(decoded),
        ok=_typed(data["ok"], bool, "ok"),
        error=_label(data.get("error"), "error"),
        metrics={_label(k, "a metric name"): _number(v) for k, v in metrics.items()},
        ends_episode=_label(data.get("ends_episode"), "ends_episode"),
    )


def _typed(value: Any, kind: type, name: str) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _label(value: Any, name: str) -> Any:
    if value is not None and (not isinstance(value, str) or len(value) > 200):
        raise TypeError(f"{name} must be a short string or null")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a metric must be a number, got {type(value).__name__}")
    return float(value)
