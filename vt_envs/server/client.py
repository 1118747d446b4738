"""Moved to :mod:`vt_envs.tools.remote.client` (the client of remote tools is a
tool-side concern, below the env ids); kept importable from here."""

from vt_envs.tools.remote.client import (
    MAX_REPLY_BYTES,
    RemoteTool,
    ToolServerClient,
    attach_tool_server,
)

__all__ = ["MAX_REPLY_BYTES", "RemoteTool", "ToolServerClient", "attach_tool_server"]
