"""What travels between :mod:`vt_envs.server.client` and :mod:`vt_envs.server.app`.

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

#: The most pixels one image in a reply may have; checked from the PNG header, before
#: decoding (a small PNG can decode to gigabytes).
MAX_IMAGE_PIXELS = 64 << 20

_IMAGE = "__vt_image_png__"


def _png(image: np.ndarray) -> dict[str, str]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return {_IMAGE: base64.b64encode(buffer.getvalue()).decode()}


def _unpng(data: Any) -> np.ndarray:
    from PIL import Image

    if not isinstance(data, str):
        raise ValueError("an image must be a base64 PNG string")
    with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as image:
        width, height = image.size  # from the header: nothing decoded yet
        if image.format != "PNG" or width * height > MAX_IMAGE_PIXELS:
            raise ValueError(
                f"an image in the reply is {image.format} {width}x{height}; at most "
                f"{MAX_IMAGE_PIXELS} pixels of PNG are accepted"
            )
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


def decode_result(data: Mapping[str, Any]) -> ToolResult:
    return ToolResult(
        text=str(data["text"]),
        images=tuple(_unpng(i[_IMAGE]) for i in data.get("images") or ()),
        ok=bool(data["ok"]),
        error=data.get("error"),
        metrics=dict(data.get("metrics") or {}),
        ends_episode=data.get("ends_episode"),
    )
