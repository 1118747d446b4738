"""Shared plumbing of the sandboxed tools: policy resolution and text formatting."""

from __future__ import annotations

from typing import Any

from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.isolation import Isolation, resolve_isolation
from vt_envs.sandbox.policy import SandboxPolicy
from vt_envs.sandbox.process import Captured


def resolve(policy: SandboxPolicy | None, isolation: str | None) -> Isolation:
    """Build the policy (``isolation`` overrides the policy's) and resolve it (fails closed)."""
    policy = policy or SandboxPolicy()
    if isolation is not None and isolation != policy.isolation:
        policy = SandboxPolicy(**{**policy.__dict__, "isolation": isolation})
    return resolve_isolation(policy)


def task_files(task: Any) -> dict[str, str | bytes]:
    """``task.assets["files"]`` (relative path -> text or bytes), or ``{}``."""
    assets = getattr(task, "assets", None) or {}
    files = assets.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, (str, bytes)) for v in files.values()):
        raise InvalidConfigError(
            "task.assets['files'] must map relative paths to str or bytes contents, "
            f"got {type(files).__name__}"
        )
    return dict(files)


def decode(captured: Captured) -> str:
    return captured.data.decode("utf-8", errors="replace")


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the head and the tail of ``text`` within ``max_chars``."""
    if len(text) <= max_chars:
        return text, False
    head = max_chars * 2 // 3
    tail = max_chars - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n... [{dropped} characters truncated] ...\n{text[-tail:]}", True


def truncation_note(captured: Captured, stream: str) -> str:
    if not captured.truncated:
        return ""
    return (
        f"[{stream} truncated: the code wrote {captured.total} bytes; "
        f"only the first {len(captured.data)} were kept]"
    )
