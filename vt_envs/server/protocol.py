"""What travels between :mod:`vt_envs.server.client` and :mod:`vt_envs.server.app`.

JSON over HTTP. A task travels without its ``gold`` field (tools never need
it): its id, prompt, metadata and assets (which may still hold what an oracle
reads: the server is trusted with tasks), where paths become strings and
images (``HxWx3 uint8`` arrays) become PNG, base64. A :class:`ToolResult` travels
whole, its images as PNG too. Error kinds the client turns into
observations are listed in :data:`ERROR_KINDS`.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from vt_envs.core.task import Task
from vt_envs.core.tool import ToolResult

__all__ = [
    "ERROR_KINDS",
    "decode_result",
    "decode_task",
    "encode_result",
    "encode_task",
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
}

_IMAGE = "__vt_image_png__"


def _png(image: np.ndarray) -> dict[str, str]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return {_IMAGE: base64.b64encode(buffer.getvalue()).decode()}


def _unpng(data: str) -> np.ndarray:
    from PIL import Image

    array = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
    array.setflags(write=False)
    return array


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.ndim == 3:
        return _png(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _unjsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {_IMAGE}:
            return _unpng(value[_IMAGE])
        return {k: _unjsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unjsonable(v) for v in value]
    return value


def encode_task(task: Task) -> dict[str, Any]:
    """``task`` as JSON, its gold left out."""
    return {
        "id": task.id,
        "prompt": task.prompt,
        "metadata": _jsonable(dict(task.metadata)),
        "assets": _jsonable(dict(task.assets)),
    }


def decode_task(data: Mapping[str, Any]) -> Task:
    return Task(
        str(data["id"]),
        str(data["prompt"]),
        None,
        _unjsonable(data.get("metadata") or {}),
        _unjsonable(data.get("assets") or {}),
    )


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
