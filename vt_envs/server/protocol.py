"""Moved to :mod:`vt_envs.tools.remote.protocol` (shared by the client, a tool-side
module, and the server above it); kept importable from here."""

from vt_envs.tools.remote.protocol import (
    ERROR_KINDS,
    MAX_IMAGE_PIXELS,
    MAX_REPLY_IMAGES,
    MAX_REPLY_TEXT_CHARS,
    decode_result,
    encode_result,
    prompt_digest,
    task_ref,
)

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
