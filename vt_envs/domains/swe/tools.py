"""The tools of VT-SWE-v0 over one shared working copy per episode: ``bash`` and ``editor``.

:class:`WorkspaceStore` makes the episode's :class:`Workspace` when the
first tool opens its session at reset (from ``task.assets["repo"]``), the
other tools join it, and it is deleted when the episode's sessions close.
``bash`` is the sandboxed persistent shell with the copy bound read-write at
``/tmp/repo`` (its start directory) and nothing else writable but the
sandbox's own size-capped ``/tmp``; after a timeout the shell restarts and the
copy is still there (``/tmp`` is new). The editor works on
the same copy from the host side, symlink-proof.

The disk quota: the copy is a filesystem of its own, as large as the quota
(:mod:`~vt_envs.domains.swe.workspace`), so a write that does not fit fails
with ``ENOSPC`` in bash, in the editor (an observation, the file unchanged)
and in the hidden-test run alike. Reaching the bound (the filesystem full:
past ``disk_quota_mb`` of data or ``max_files`` entries) ends the episode
truncated with ``"disk_quota"``, graded 0: bash checks while a call runs
(every ``quota_poll_s``) and when it returns, the editor after each call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vt_envs.core.tool import ToolResult
from vt_envs.domains.swe.editor import EditorTool
from vt_envs.domains.swe.workspace import (
    DISK_QUOTA_MB,
    MAX_FILES,
    SHOWN_AS,
    Workspace,
    empty_volume,
)
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.bash_session import BashSession
from vt_envs.sandbox.volume import Volume
from vt_envs.tools.bash import BashTool

__all__ = ["SWEBashTool", "SWEEditorTool", "WorkspaceStore"]


class WorkspaceStore:
    """The running episode's working copy, shared by the env's SWE tools and its verifier.

    Args:
        base_of: ``task -> repository directory`` the copy is made from
            (default: ``task.assets["repo"]``).
        disk_quota_mb, max_files: each copy's bounds (:class:`Workspace`).
        spare: keep the next episode's (empty) volume mounted ahead of time, in a
            background thread, so a reset only fills it (the holder's start, ~5 ms,
            leaves the reset's critical path). Released by :meth:`shutdown`.
    """

    def __init__(
        self,
        base_of: Callable[[Any], str | Path] | None = None,
        *,
        disk_quota_mb: int = DISK_QUOTA_MB,
        max_files: int = MAX_FILES,
        spare: bool = True,
    ):
        for name, value in (("disk_quota_mb", disk_quota_mb), ("max_files", max_files)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be a positive int, got {value!r}")
        self.base_of = base_of or _repo_of
        self.disk_quota_mb, self.max_files, self.spare = disk_quota_mb, max_files, spare
        self._current: Workspace | None = None
        self._task: Any = None
        self._spares: list[concurrent.futures.Future[Volume]] = []  # at most one
        # A store dropped without shutdown() still releases its spare.
        self._finalizer = weakref.finalize(self, _release, self._spares)
        self.creation_s: list[float] = []  # every copy's creation time, for benchmarks

    def open(self, task: Any) -> Workspace:
        """The episode's copy: made by the first tool to open, joined by the rest."""
        if self._current is None or self._current.closed or self._task is not task:
            self._current = Workspace(
                self.base_of(task),
                disk_quota_mb=self.disk_quota_mb,
                max_files=self.max_files,
                volume=self._take_spare(),
            )
            self._task = task
            self.creation_s.append(self._current.created_s)
            if self.spare and not self._spares:
                self._spares.append(
                    _background().submit(empty_volume, self.disk_quota_mb, self.max_files)
                )
        return self._current

    def _take_spare(self) -> Volume | None:
        """The spare volume if it is ready (one still being made stays for next time; one
        that failed is dropped, and the copy made here says why)."""
        if not self._spares or not self._spares[0].done():
            return None
        future = self._spares.pop()
        return future.result() if future.exception() is None else None

    def shutdown(self) -> None:
        """Release the spare volume (the env is closing; idempotent)."""
        _release(self._spares)

    @property
    def active(self) -> Workspace | None:
        """The open copy of the running episode, if any."""
        if self._current is not None and not self._current.closed:
            return self._current
        return None

    def current(self, task: Any) -> Workspace | None:
        """The open copy of ``task``'s episode, if any (what the verifier grades)."""
        if self._current is not None and not self._current.closed and self._task is task:
            return self._current
        return None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()


_BACKGROUND: list[concurrent.futures.ThreadPoolExecutor] = []


def _background() -> concurrent.futures.ThreadPoolExecutor:
    if not _BACKGROUND:
        _BACKGROUND.append(
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vt-swe-volumes")
        )
    return _BACKGROUND[0]


def _release(spares: list[concurrent.futures.Future[Volume]]) -> None:
    """Close the spare volumes (waiting for one still being made: it is quick)."""
    while spares:
        future = spares.pop()
        try:
            future.result(timeout=60).close()
        except Exception:  # it failed, or never came: nothing to close
            pass


def _repo_of(task: Any) -> Path:
    repo = (getattr(task, "assets", None) or {}).get("repo")
    if repo is None:
        raise InvalidConfigError(
            f"task {getattr(task, 'id', task)!r} has no assets['repo'] (the repository "
            "directory its working copy is made from)"
        )
    return Path(repo)


def quota_reached(workspace: Workspace, over: tuple[int, int]) -> ToolResult:
    """Empty ``workspace`` (it passed its quota: :meth:`Workspace.discard`) and say so in the
    result that ends the episode."""
    workspace.discard()
    used, entries = over
    return ToolResult(
        text=(
            f"The repository reached its disk quota ({used >> 20} MB in {entries} entries; "
            f"the limit is {workspace.quota_bytes >> 20} MB and {workspace.max_files} "
            "entries). The working copy was discarded, and the episode ends."
        ),
        ok=False,
        error="disk_quota",
        metrics={"disk_bytes": float(used), "disk_entries": float(entries)},
        ends_episode="disk_quota",
    )


class SWEBashTool(BashTool):
    """``bash`` in the sandbox, started in the episode's working copy (bound read-write).

    The kernel bounds the copy (module docstring); this tool ends the episode once the
    copy is full: it reads the copy's filesystem every ``quota_poll_s`` while a call runs
    (a ``statvfs``: microseconds, whatever the tree) and once more when it returns; a
    full copy stops the call at once (a flood does not wait for its deadline).
    """

    description = (
        "Run bash commands in a sandboxed shell, started in the repository at /tmp/repo (the "
        "only writable place besides /tmp). The working directory and variables persist "
        "between calls; a command that outlives its deadline is stopped and the shell "
        "restarted (the repository keeps your changes). No network access."
    )

    def __init__(self, store: WorkspaceStore, *, quota_poll_s: float = 0.1, **kwargs: Any):
        super().__init__(**kwargs)
        if not quota_poll_s > 0:
            raise InvalidConfigError(f"quota_poll_s must be > 0, got {quota_poll_s!r}")
        self.store = store
        self.quota_poll_s = quota_poll_s

    async def call(
        self, session: BashSession, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        limit = self.timeout_s if timeout_s is None else timeout_s
        workspace = self.store.active
        running = asyncio.ensure_future(session.run(str(arguments["command"]), limit))
        try:
            over = await self._watch(workspace, running)
        except BaseException:
            running.cancel()  # cancelling the run kills the shell (SandboxSession contract)
            await asyncio.gather(running, return_exceptions=True)
            raise
        if over is None:
            return self.format(running.result(), limit)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert workspace is not None
        return await asyncio.to_thread(quota_reached, workspace, over)

    async def _watch(
        self, workspace: Workspace | None, running: asyncio.Future[Any]
    ) -> tuple[int, int] | None:
        """Check the copy until ``running`` ends; ``(bytes, entries)`` once past its quota."""
        if workspace is None:  # no copy (sandbox started without one): nothing to bound
            await running
            return None
        while True:
            await asyncio.wait({running}, timeout=self.quota_poll_s)
            over = workspace.over_quota()
            if over is not None or running.done():
                return over

    async def open_session(self, task: Any, *, seed: int = 0) -> BashSession:
        workspace = self.store.open(task)
        rw_binds = {SHOWN_AS: str(workspace.path)} if self.isolation.sandboxed else {}
        cwd = SHOWN_AS if self.isolation.sandboxed else str(workspace.path)
        # A src/ layout's package imports from src/, as in the hidden-test run.
        exports = {"PYTHONPATH": f"{cwd}/src"} if (workspace.path / "src").is_dir() else {}
        session = BashSession(
            self.isolation, seed=seed, rw_binds=rw_binds, cwd=cwd, exports=exports
        )
        await session.start()
        return session

    async def close_session(self, session: BashSession | None) -> None:
        await super().close_session(session)
        self.store.close()

    async def aclose(self) -> None:
        await super().aclose()
        await asyncio.to_thread(self.store.shutdown)


class SWEEditorTool(EditorTool):
    """The editor on the episode's working copy (see :class:`EditorTool`). Its writes count
    against the copy's quota as they happen: one that does not fit is refused (an
    observation; the file is unchanged), and an edit that fills the copy ends the episode
    as bash does."""

    def __init__(self, store: WorkspaceStore, **kwargs: Any):
        super().__init__(lambda task: store.open(task).files, **kwargs)
        self.store = store

    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float
    ) -> ToolResult:
        result = await super().call(session, arguments, timeout_s=timeout_s)
        workspace = self.store.active
        over = workspace.over_quota() if workspace is not None else None
        if over is None:
            return result
        return await asyncio.to_thread(quota_reached, workspace, over)

    async def close_session(self, session: Any) -> None:
        await super().close_session(session)
        self.store.close()
