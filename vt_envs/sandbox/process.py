"""One sandboxed process tree: spawning it, talking to it, capping its output, killing it.

:class:`SandboxProcess` starts ``inside.py`` under an
:class:`~vt_envs.sandbox.isolation.Isolation`, sends it the setup frame and
waits until it is ready. Output on fds 1/2 is drained continuously by
:class:`_Collector` tasks that keep at most ``max_output_bytes`` per call and
count the rest (so a flood can neither fill host memory nor block the
worker); the end of a call's output is a per-call random marker.

:meth:`SandboxProcess.kill` is the only way a sandbox ends: SIGKILL to the
host process group, SIGKILL to every cgroup member, then it waits until every
process of the tree is gone and removes the cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import secrets
import shutil
import signal
import struct
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vt_envs.core.tool import check_timeout
from vt_envs.errors import SandboxUnavailableError
from vt_envs.sandbox.cgroups import Cgroup
from vt_envs.sandbox.isolation import INSIDE_SOURCE, Isolation
from vt_envs.sandbox.volume import split_holder_path

__all__ = ["Captured", "SandboxProcess", "WorkerLost", "pids_of_uid", "process_tree"]

_TAIL = 64
# Frames an ending episode may have left on the control pipe before a recycled
# sandbox's ready message; more than this and the sandbox is not reused.
_MAX_STALE_FRAMES = 64
#: The largest frame the host reads from a sandbox. A longer one is a protocol
#: violation (the worker is treated as crashed), so no frame can grow host memory.
MAX_FRAME_BYTES = 8 << 20
_USED_UIDS: set[int] = set()
_counter = itertools.count()


class WorkerLost(Exception):
    """Internal: the sandboxed process timed out or died; ``kind`` says which."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class Captured:
    """One call's output on one stream.

    Attributes:
        data: the first ``max_output_bytes`` bytes.
        total: how many bytes the call wrote in all.
        tail: the last bytes written (kept even when ``data`` is truncated).
    """

    data: bytes
    total: int
    tail: bytes = b""

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)


class _Collector:
    """Drains one pipe forever; splits it into calls at each call's marker."""

    def __init__(self, reader: asyncio.StreamReader, cap: int):
        self._reader, self._cap = reader, cap
        self._buf = bytearray()
        self._offset = self._start = 0
        self._window = b""  # last bytes seen, to find a marker split across reads
        self._marker: bytes | None = None
        self._done = asyncio.Event()
        self._result: Captured | None = None
        self.eof = False
        self._task = asyncio.ensure_future(self._run())

    def begin(self, marker: bytes) -> None:
        self._buf = bytearray()
        self._start = self._offset
        self._marker, self._result = marker, None
        self._done.clear()

    @property
    def finished(self) -> bool:
        """The current call's marker has been seen."""
        return self._result is not None

    def snapshot(self) -> Captured:
        """What the current call wrote so far (used when it never finished)."""
        return Captured(bytes(self._buf), self._offset - self._start, self._window[-_TAIL:])

    async def wait(self, timeout_s: float) -> Captured:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout_s)
        return self._result or self.snapshot()

    async def _run(self) -> None:
        while True:
            try:
                chunk = await self._reader.read(1 << 16)
            except (ConnectionError, OSError):
                chunk = b""
            if not chunk:
                self.eof = True
                self._done.set()
                return
            self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        window_start = self._offset - len(self._window)
        combined = self._window + chunk
        marker = self._marker
        index = combined.find(marker) if marker else -1
        if index >= 0:
            end = window_start + index  # absolute offset of the marker
            self._keep(chunk[: max(0, end - self._offset)])
            del self._buf[end - self._start :]
            tail = combined[max(0, index - _TAIL) : index]
            self._result = Captured(bytes(self._buf), end - self._start, tail)
            self._marker = None
            self._offset += len(chunk)
            self._window = b""
            self._start = self._offset
            self._buf = bytearray()
            self._done.set()
            return
        self._keep(chunk)
        self._offset += len(chunk)
        self._window = combined[-max(_TAIL, len(marker or b"")) :]

    def _keep(self, data: bytes) -> None:
        room = self._cap - len(self._buf)
        if room > 0:
            self._buf += data[:room]

    def cancel(self) -> None:
        self._task.cancel()


def _allocate_uid(base: int) -> int:
    while True:
        uid = base + random.randrange(1 << 20)
        if uid not in _USED_UIDS:
            _USED_UIDS.add(uid)
            return uid


def process_tree(root_pid: int) -> set[int]:
    """``root_pid`` and all its descendants (host pids), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root_pid]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def pids_of_uid(uid: int) -> set[int]:
    """Live (non-zombie) host pids whose real uid is ``uid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] != b"Z"


def _frame(obj: Any) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


class SandboxProcess:
    """A started sandbox running ``inside.py`` in ``mode`` ``"python"`` or ``"bash"``.

    Create with :meth:`start`; end with :meth:`kill` (idempotent).
    """

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process
        self.isolation: Isolation
        self.uid = -1
        self.workdir = ""
        self._host_workdir: str | None = None
        self._cgroup: Cgroup | None = None
        self._ctrl: asyncio.StreamReader
        self._ctrl_transport: asyncio.BaseTransport | None = None
        self.stdout: _Collector
        self.stderr: _Collector | None = None
        self._signalled = False  # SIGKILL sent (kill_now); kill() still reaps
        self._killed = False
        self._tree: set[int] = set()  # every host pid of this sandbox seen so far
        self._ends = -1  # recycling: the host ends an episode here (an output marker) ...
        self._acks_fd = -1  # ... and the sandbox's pristine parent answers b"r" here
        self._acks: asyncio.StreamReader | None = None
        self._acks_transport: asyncio.BaseTransport | None = None

    @classmethod
    async def start(
        cls,
        isolation: Isolation,
        *,
        mode: str,
        files: dict[str, str | bytes] | None = None,
        python_mode: str = "persistent",
        max_repr_chars: int = 10_000,
        service: Mapping[str, Any] | None = None,
        binds: Mapping[str, str] | None = None,
        rw_binds: Mapping[str, str] | None = None,
        start_timeout_s: float = 10.0,
        recycle: bool = False,
    ) -> SandboxProcess:
        """Start a sandbox and wait until the code inside is ready for requests.

        ``mode``: ``"python"``, ``"bash"`` or ``"service"`` (``service`` then
        names the module and its options, see ``inside.py``). ``binds`` maps
        paths inside the sandbox (under ``/tmp``) to host paths, bound read-only;
        ``rw_binds`` likewise, bound read-write (an agent's working copy). The
        isolation-less backend binds nothing.

        ``recycle`` (python mode in a sandbox with its own pid namespace, no
        binds): the sandbox can serve episode after episode (:meth:`recycle`).

        Raises :class:`SandboxUnavailableError` when it does not come up.
        """
        self = cls()
        recycle = (
            recycle and mode == "python" and isolation.sandboxed and not binds and not rw_binds
        )
        policy = isolation.policy
        self.isolation = isolation
        # As root, every sandbox runs as a fresh host uid; otherwise as the caller's
        # own uid, inside a user namespace that bubblewrap creates.
        self.uid = _allocate_uid(policy.uid_base) if isolation.drops_uid else os.getuid()
        if isolation.sandboxed:
            self.workdir = policy.workdir
        else:
            self._host_workdir = self.workdir = tempfile.mkdtemp(prefix="vt-unsafe-work-")
        if mode == "service" and service and isolation.sandboxed:
            service, binds = _bind_service_code(service, binds or {})
        binds = _check_binds(binds or {})
        rw_binds = _check_binds(rw_binds or {})
        cgroup_fds: list[int] = []
        ctrl_r = -1
        inner: tuple[int, ...] = ()  # the recycling pipes' ends inside the sandbox
        try:
            cgroup_fds = self._make_cgroup()
            ctrl_r, ctrl_w = os.pipe()
            if recycle:
                ends_r, self._ends = os.pipe()
                acks_r, acks_w = os.pipe()
                self._acks_fd, inner = acks_r, (ends_r, acks_w)
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *isolation.command(ctrl_w, self.workdir, binds=binds, rw_binds=rw_binds),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT if mode == "bash" else asyncio.subprocess.PIPE,
                    pass_fds=(ctrl_w, *cgroup_fds, *inner),
                    start_new_session=True,
                    # bwrap too gets only our variables: its own /proc/<pid>/environ
                    # must not show the host's environment to the code inside.
                    env=isolation.env(self.workdir),
                    cwd="/",
                )
            finally:
                os.close(ctrl_w)
                for fd in (*cgroup_fds, *inner):
                    os.close(fd)
        except BaseException:
            for fd in (ctrl_r, self._ends, self._acks_fd):
                if fd >= 0:
                    os.close(fd)
            self._ends = self._acks_fd = -1
            self._release_host_resources()
            raise
        extra = {
            "recycle_fds": list(inner) or None,
            "python_mode": python_mode,
            "max_repr_chars": max_repr_chars,
            "service": dict(service) if service else None,
            # bwrap binds them itself; the unshare backend's inside.py does it as root
            "binds": _inside_binds(binds) if isolation.backend == "unshare" else [],
            "rw_binds": _inside_binds(rw_binds) if isolation.backend == "unshare" else [],
            "hidden": (
                [os.path.realpath(p) for p in policy.hidden_paths]
                if isolation.backend == "unshare"
                else []
            ),
        }
        try:
            return await self._handshake(mode, files, extra, ctrl_r, cgroup_fds, start_timeout_s)
        except BaseException:
            # Cancelled (or failed) while starting: the sandbox must not outlive the call.
            self.kill_now()
            _reap_later(self)
            raise

    def _make_cgroup(self) -> list[int]:
        """Create the episode's cgroup where the machine allows; the fds that join it."""
        isolation, policy = self.isolation, self.isolation.policy
        if not isolation.cgroup_version:
            return []
        try:
            self._cgroup = Cgroup.create(
                isolation.cgroup_version,
                f"{os.getpid()}-{self.uid}-{next(_counter)}",
                (policy.memory_mb + policy.workdir_mb) << 20,
                policy.processes,
            )
            return self._cgroup.open_attach_fds()
        except OSError:
            if self._cgroup:
                self._cgroup.destroy()
            self._cgroup = None
            return []

    def _release_host_resources(self) -> None:
        if self._cgroup:
            self._cgroup.destroy()
        if self._host_workdir:
            shutil.rmtree(self._host_workdir, ignore_errors=True)
        _USED_UIDS.discard(self.uid)

    async def _handshake(
        self,
        mode: str,
        files: dict[str, str | bytes] | None,
        extra: dict[str, Any],
        ctrl_r: int,
        cgroup_fds: list[int],
        start_timeout_s: float,
    ) -> SandboxProcess:
        """Connect the pipes, send the setup frame and wait for the ready message."""
        isolation = self.isolation
        policy = isolation.policy
        loop = asyncio.get_running_loop()
        self._ctrl = asyncio.StreamReader(limit=1 << 26)
        self._ctrl_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self._ctrl), os.fdopen(ctrl_r, "rb", 0)
        )
        if self._acks_fd >= 0:
            self._acks = asyncio.StreamReader(limit=1 << 10)
            self._acks_transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(self._acks), os.fdopen(self._acks_fd, "rb", 0)
            )
        cap = policy.max_output_bytes
        self.stdout = _Collector(self.proc.stdout, cap)
        self.stderr = _Collector(self.proc.stderr, cap) if mode != "bash" else None
        inner_uid = self.uid if isolation.drops_uid else isolation.inner_uid
        setup = {
            "mode": mode,
            "uid": inner_uid,
            "gid": inner_uid,
            "workdir": self.workdir,
            "files": _encode_files(files or {}),
            "rlimits": policy.rlimits(),
            "seccomp": isolation.seccomp_program.hex() if isolation.seccomp_program else None,
            "cgroup_fds": cgroup_fds,
            "drop_privileges": isolation.drops_uid,
            "userns": isolation.drops_uid,
            "own_pid_ns": isolation.sandboxed,
            "mount_tmp": policy.workdir_mb << 20 if isolation.backend == "unshare" else 0,
            **extra,
        }
        try:
            await self._send(INSIDE_SOURCE + _frame(setup))
            ready = await asyncio.wait_for(self.read_frame(), start_timeout_s)
        except (WorkerLost, asyncio.TimeoutError, ConnectionError) as exc:
            ready = {"status": "setup_failed", "message": f"no ready message ({exc!r})"}
        if not isinstance(ready, dict):
            ready = {"status": "setup_failed", "message": "a malformed ready message"}
        if ready.get("status") != "ready":
            errors = self.stdout.snapshot().data + (
                self.stderr.snapshot().data if self.stderr else b""
            )
            await self.kill()
            raise SandboxUnavailableError(
                f"the {isolation.backend} sandbox failed to start: {ready.get('message')}; "
                f"its output: {errors.decode(errors='replace')[-2000:]!r}"
            )
        self.host_pids()  # remember the tree (bwrap, its init, the worker) for reaping
        return self

    @property
    def alive(self) -> bool:
        return not (self._killed or self._signalled) and self.proc.returncode is None

    def _reap_orphans(self) -> None:
        """Reap the sandbox's processes that ended up as our children.

        When bubblewrap's outer process dies, its child (the sandbox's init) is
        re-parented to the nearest child subreaper: the host process itself if
        it is one (PID 1 of a container, a supervisor). Nobody else would wait
        for it, so its zombie would stay for the host's lifetime.
        """
        for pid in self._tree - {self.proc.pid}:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def kill_now(self) -> None:
        """SIGKILL the whole tree at once, without waiting (usable while being cancelled).

        :meth:`kill` must still run later to reap the tree and remove its cgroup.
        """
        if self._killed or self._signalled or not hasattr(self, "proc"):
            return
        self._signalled = True
        pids = self.host_pids()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def _send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise WorkerLost("crashed", f"could not send the request ({exc})") from exc

    async def send_text(self, text: str) -> None:
        """Write raw text to the process's stdin (bash mode)."""
        await self._send(text.encode())

    async def read_frame(self) -> dict[str, Any]:
        """Read one frame: at most :data:`MAX_FRAME_BYTES`, a JSON object, or ``WorkerLost``."""
        try:
            header = await self._ctrl.readexactly(4)
            (length,) = struct.unpack(">I", header)
            if length > MAX_FRAME_BYTES:
                raise WorkerLost(
                    "crashed", f"protocol violation: a {length}-byte frame ({MAX_FRAME_BYTES} max)"
                )
            frame = json.loads(await self._ctrl.readexactly(length))
        except asyncio.IncompleteReadError as exc:
            raise WorkerLost("crashed", "the worker exited") from exc
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise WorkerLost("crashed", f"protocol violation: garbled frame ({exc})") from exc
        if not isinstance(frame, dict):
            raise WorkerLost("crashed", f"protocol violation: a {type(frame).__name__} frame")
        return frame

    async def _exchange(
        self, request: dict[str, Any], timeout_s: float, nonce: str | None = None
    ) -> dict[str, Any]:
        """Send ``request`` with a nonce (fresh by default); return the reply that echoes it.

        Raises :class:`WorkerLost` on timeout, death, or a reply that is not
        this request's (forged or stale): the caller kills the sandbox.
        """
        nonce = nonce or _new_nonce()
        check_timeout("timeout_s", timeout_s, limit=math.inf)  # a NaN breaks the timer heap
        await self._send(_frame({**request, "nonce": nonce}))
        try:
            async with asyncio.timeout(timeout_s):  # (wait_for would start a task per request)
                reply = await self.read_frame()
        except TimeoutError:
            raise WorkerLost("timeout") from None
        if reply.get("nonce") != nonce:
            raise WorkerLost("crashed", "protocol violation: a reply to another request")
        return reply

    async def execute(
        self, request: dict[str, Any], timeout_s: float
    ) -> tuple[dict[str, Any], Captured, Captured]:
        """Python mode: run one request; returns ``(reply, stdout, stderr)``.

        Raises :class:`WorkerLost` (``"timeout"`` or ``"crashed"``) with the
        sandbox still running; the caller kills it.
        """
        # The output marker and the reply nonce are one value: the worker writes it to
        # fds 1 and 2 when the call ends, then echoes it in its reply.
        marker = _new_nonce()
        self.stdout.begin(marker.encode())
        self.stderr.begin(marker.encode())
        reply = await self._exchange(request, timeout_s, nonce=marker)
        out = await self.stdout.wait(5.0)
        err = await self.stderr.wait(5.0)
        return reply, out, err

    @property
    def recyclable(self) -> bool:
        """Started with ``recycle=True`` (and still able to serve another episode)."""
        return self._acks is not None and self.alive

    async def recycle(self, timeout_s: float = 5.0) -> bool:
        """End this sandbox's episode and make it ready for the next one, as fresh.

        The sandbox's pristine parent kills every process of the episode,
        empties the writable directories and forks a new interpreter; the
        episode's output up to that point is dropped. ``False`` (the caller
        kills the sandbox) if it is not recyclable or does not answer in time.
        """
        if not self.recyclable:
            return False
        marker = _new_nonce()
        self.stdout.begin(marker.encode())
        if self.stderr is not None:
            self.stderr.begin(marker.encode())
        try:
            os.write(self._ends, marker.encode() + b"\n")
            async with asyncio.timeout(timeout_s):
                if await self._acks.readexactly(1) != b"r":
                    return False
                await self.stdout.wait(timeout_s)
                if self.stderr is not None:
                    await self.stderr.wait(timeout_s)
                # Frames the dead episode left on the control pipe come first: skip
                # to the new interpreter's ready message, which echoes the marker.
                for _ in range(_MAX_STALE_FRAMES):
                    frame = await self.read_frame()
                    if frame.get("status") == "ready" and frame.get("marker") == marker:
                        return True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, WorkerLost):
            return False
        return False

    async def request(self, payload: Any, timeout_s: float) -> Any:
        """Service mode: send ``payload``, return the service's reply payload.

        Raises :class:`WorkerLost` as :meth:`_exchange` does, and when the
        service reports an error of its own (``"crashed"``, with its message).
        """
        reply = await self._exchange({"payload": payload}, timeout_s)
        if reply.get("status") != "ok":
            raise WorkerLost("crashed", f"the service failed: {str(reply.get('message'))[:500]}")
        return reply.get("payload")

    def host_pids(self) -> set[int]:
        """Host pids of every process of this sandbox that is alive now."""
        pids = process_tree(self.proc.pid) if self.proc.returncode is None else set()
        if self._cgroup:
            pids |= self._cgroup.pids()
        self._tree |= pids
        return {p for p in pids if _alive(p)}

    async def kill(self, wait_s: float = 5.0) -> None:
        """SIGKILL the whole tree, wait until it is gone, remove the cgroup and work dir."""
        if self._killed:
            return
        self._killed = True
        pids = self.host_pids() if hasattr(self, "proc") else set()
        if hasattr(self, "proc") and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._cgroup:
            try:
                await asyncio.to_thread(self._cgroup.destroy)
            except RuntimeError:  # interpreter shutdown: no executor left
                self._cgroup.destroy()
        if hasattr(self, "proc"):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), wait_s)
        deadline = time.monotonic() + wait_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self._reap_orphans()
        for collector in (getattr(self, "stdout", None), self.stderr):
            if collector:
                collector.cancel()
        if self._ctrl_transport:
            self._ctrl_transport.close()
        if self._acks_transport:
            self._acks_transport.close()
        elif self._acks_fd >= 0:  # never connected (the start failed first)
            with contextlib.suppress(OSError):
                os.close(self._acks_fd)
        if self._ends >= 0:
            with contextlib.suppress(OSError):
                os.close(self._ends)
            self._ends = -1
        if hasattr(self, "proc") and self.proc.stdin:
            self.proc.stdin.close()
        if self._host_workdir:
            shutil.rmtree(self._host_workdir, ignore_errors=True)
        _USED_UIDS.discard(self.uid)


_REAPING: set[asyncio.Task] = set()


def _reap_later(proc: SandboxProcess) -> None:
    """Finish killing ``proc`` in the background (its starter was cancelled)."""
    task = asyncio.ensure_future(proc.kill())
    _REAPING.add(task)
    task.add_done_callback(_REAPING.discard)


def _new_nonce() -> str:
    return "\x1e" + secrets.token_hex(16) + "\x1e"


# Where a service's package directory is bound inside the sandbox.
_SERVICE_CODE = "/tmp/vt-service-code"


def _bind_service_code(
    service: Mapping[str, Any], binds: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``service`` and ``binds`` with the service's top-level package directory bound
    read-only at a fixed path, and the package paths pointed there.

    The sandbox covers ``/tmp``, ``/root`` and ``/home`` with empty tmpfs; an
    editable install (a checkout in ``/tmp/ci`` or ``~/vt``) puts no path of it
    on ``sys.path`` for the interpreter's own binds to bring back.
    """
    packages = dict(service["packages"])
    if not packages:
        return dict(service), dict(binds)
    top = min(packages, key=len)  # "vt_envs": the shortest dotted name is the root
    root = packages[top]
    target = f"{_SERVICE_CODE}/{top}"
    moved = {
        name: target + path[len(root) :] if path == root or path.startswith(root + "/") else path
        for name, path in packages.items()
    }
    return {**service, "packages": moved}, {**binds, target: root}


def _check_binds(binds: Mapping[str, str]) -> dict[str, str]:
    """``binds`` (sandbox path -> host path), checked: targets under ``/tmp``, sources exist."""
    checked = {}
    for target, source in binds.items():
        target = os.path.normpath(target)
        if not target.startswith("/tmp/") or target.startswith("/tmp/work"):
            raise ValueError(f"bind targets must be under /tmp/ (not the work dir), got {target!r}")
        if not os.path.exists(source):
            raise FileNotFoundError(f"bind source {source!r} does not exist")
        # A path into a volume holder's namespace stays as written: resolving it here
        # would lead to the host's (empty) mount point (see Isolation.command).
        pid, _ = split_holder_path(source)
        checked[target] = os.path.normpath(source) if pid else os.path.realpath(source)
    return checked


def _inside_binds(binds: Mapping[str, str]) -> list[list[str]]:
    """``[source, target]`` pairs for ``inside.py``, sources as the sandbox's mount
    namespace sees them (a volume holder's, where the sandbox was started in it)."""
    return [[split_holder_path(source)[1], target] for target, source in binds.items()]


def _encode_files(files: dict[str, str | bytes]) -> dict[str, list[str]]:
    encoded = {}
    for rel, content in files.items():
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise ValueError(f"asset paths must be relative and stay in the work dir, got {rel!r}")
        if isinstance(content, bytes):
            encoded[rel] = ["hex", content.hex()]
        else:
            encoded[rel] = ["text", str(content)]
    return encoded
