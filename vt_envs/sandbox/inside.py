"""Code that runs *inside* the sandbox (stdlib only; the host passes it via ``-c``).

It starts as root inside fresh mount/pid/net namespaces (set up by bwrap or
unshare), and before any model-written code runs it:

1. reads one setup frame from stdin (uid, rlimits, seccomp program, files);
2. joins the episode's cgroup through a file descriptor the host opened;
3. writes the episode's files into the private work dir;
4. drops to the unprivileged uid/gid (no supplementary groups), sets
   ``no_new_privs``, enters a new user namespace mapping that uid to 1000,
   clears every capability, installs the seccomp filter and lowers rlimits.

Then it runs the persistent Python worker loop (``mode == "python"``), a
service module's request loop (``mode == "service"``, e.g. the SQL worker),
or ``exec``s bash (``mode == "bash"``). Host <-> worker frames are a 4-byte
big-endian length followed by UTF-8 JSON; requests come on stdin, replies go
to the control fd given in ``argv[1]``, and every reply echoes its request's
nonce. Model output goes to fds 1 and 2, which the host caps and reads; the
end of each call is marked by writing the call's nonce to both.

The host trusts nothing that comes back (frames are size-capped, validated,
and matched to their request by nonce; any violation is a crashed worker).
The loop below still guards itself: it holds its own references to the
functions it uses, so code that rebinds ``json.dumps`` or ``os.write`` in the
shared interpreter does not silently change the replies.
"""

import ctypes
import json
import os
import resource
import signal
import struct
import sys

_CTRL_FD = int(sys.argv[1]) if len(sys.argv) > 1 else 3
_LIBC = ctypes.CDLL(None, use_errno=True)
# Pinned before any model code runs (see the module docstring).
_dumps, _loads = json.dumps, json.loads
_os_read, _os_write, _os_exit, _os_kill = os.read, os.write, os._exit, os.kill
_os_dup2, _os_waitpid, _os_getpid, _os_listdir = os.dup2, os.waitpid, os.getpid, os.listdir
_pack, _unpack = struct.pack, struct.unpack
_MAX_CHILD_REPLY = 8 << 20


def _read_exact(fd, n):
    data = b""
    while len(data) < n:
        chunk = _os_read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _read_frame(fd):
    (length,) = _unpack(">I", _read_exact(fd, 4))
    return _loads(_read_exact(fd, length))


def _write_frame(fd, obj):
    data = _dumps(obj).encode()
    payload = _pack(">I", len(data)) + data
    while payload:
        payload = payload[_os_write(fd, payload) :]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write_files(workdir, files, uid, gid):
    os.makedirs(workdir, exist_ok=True)
    os.chown(workdir, uid, gid)
    for rel, (kind, content) in files.items():
        path = os.path.normpath(os.path.join(workdir, rel))
        if not path.startswith(workdir + "/"):
            raise ValueError(f"asset path escapes the work dir: {rel!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = bytes.fromhex(content) if kind == "hex" else content.encode()
        with open(path, "wb") as f:
            f.write(data)
    for root, dirs, names in os.walk(workdir):
        for name in dirs + names:
            os.chown(os.path.join(root, name), uid, gid)


def _mount_tmpfs(target, size_bytes):
    # unshare fallback: a private, size-capped /tmp in our own mount namespace.
    ret = _LIBC.mount(
        b"tmpfs", target.encode(), b"tmpfs", 0, f"size={size_bytes},mode=1777".encode()
    )
    _check(ret, f"mount tmpfs on {target}")


def _bind(source, target, writable=False):
    MS_BIND, MS_REMOUNT, MS_RDONLY, MS_REC = 0x1000, 0x20, 0x1, 0x4000
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _check(_LIBC.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), "bind")
    if not writable:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        _check(_LIBC.mount(None, target.encode(), None, flags, None), "remount read-only")


def _enter_user_namespace(uid, gid):
    # New user namespace after the uid drop: inside we are uid/gid 1000.
    CLONE_NEWUSER = 0x10000000
    PR_SET_DUMPABLE = 4  # setuid cleared it; our /proc/self/*_map files are root's until set
    _check(_LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    _check(_LIBC.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"1000 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"1000 {gid} 1")


def _clear_capabilities():
    # Creating the user namespace granted capabilities inside it; drop them all.
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
    data = (ctypes.c_uint32 * 6)()
    _check(_LIBC.syscall(126 if os.uname().machine == "x86_64" else 91, header, data), "capset")


def _install_seccomp(program):
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = SockFprog(len(program) // 8, program)
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _check(
        _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


def _apply_rlimits(limits):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _setup():
    setup = _read_frame(0)
    if setup.get("cgroup_fds"):
        for fd in setup["cgroup_fds"]:
            os.write(fd, b"0")  # cgroup v1: "0" moves the writer itself
            os.close(fd)
    if setup.get("mount_tmp"):
        _mount_tmpfs("/tmp", setup["mount_tmp"])
    for host_path, target in setup.get("binds", ()):  # unshare backend (bwrap binds itself)
        _bind(host_path, target)
    for host_path, target in setup.get("rw_binds", ()):
        _bind(host_path, target, writable=True)
    for path in setup.get("hidden", ()):  # unshare backend (bwrap hides them itself)
        if os.path.isdir(path):
            _mount_tmpfs(path, 1 << 20)
        elif os.path.exists(path):
            _bind("/dev/null", path)
    uid, gid = setup["uid"], setup["gid"]
    _write_files(setup["workdir"], setup.get("files", {}), uid, gid)
    if setup["drop_privileges"]:  # root on the host: become a fresh unprivileged uid
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    PR_SET_NO_NEW_PRIVS = 38
    _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if setup.get("userns"):
        _enter_user_namespace(uid, gid)
    # Whatever we started with (bwrap's user namespace, the one made above): none left.
    _clear_capabilities()
    if setup.get("seccomp"):
        _install_seccomp(bytes.fromhex(setup["seccomp"]))
    _apply_rlimits(setup.get("rlimits", {}))
    os.chdir(setup["workdir"])
    return setup


# ---------------------------------------------------------------- Python worker


def _run_python(setup):
    import ast
    import builtins
    import io
    import traceback

    saved_out, saved_err = os.dup(1), os.dup(2)
    stdin_fd = os.dup(0)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)  # model code must not read our request stream
    os.close(devnull)
    fresh = setup.get("python_mode") == "fork"
    own_pid_ns = setup.get("own_pid_ns", False)  # never kill(-1) outside a pid namespace
    supervised = setup.get("supervised", False)  # an episode of a recycled sandbox
    max_repr = int(setup.get("max_repr_chars", 10000))
    builtins_snapshot = dict(builtins.__dict__)
    namespace = {"__name__": "__main__", "__builtins__": builtins}

    def reset_streams():
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")

    def format_exc(exc, skip_frames):
        tb = exc.__traceback__
        for _ in range(skip_frames):
            if tb is not None:
                tb = tb.tb_next
        lines = traceback.format_exception(type(exc), exc, tb)
        return "".join(lines)

    def execute(code, ns):
        try:
            tree = ast.parse(code, "<cell>", "exec")
        except SyntaxError as exc:
            return {
                "status": "error",
                "kind": "syntax_error",
                "exc_type": "SyntaxError",
                "message": str(exc),
                "traceback": format_exc(exc, 99),
            }
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        owner = os.getpid()
        try:
            exec(compile(tree, "<cell>", "exec"), ns)
            value = eval(compile(last, "<cell>", "eval"), ns) if last is not None else None
        except SystemExit as exc:
            if os.getpid() != owner:  # a process the cell forked must never reach the protocol
                os._exit(0)
            builtins.__dict__.update(builtins_snapshot)
            return {"status": "exit", "code": repr(exc.code)}
        except BaseException as exc:  # the agent's code raised: report, keep going
            if os.getpid() != owner:  # (a fork bomb's children raise here when forks fail)
                os._exit(1)
            builtins.__dict__.update(builtins_snapshot)  # formatting needs len, str, ...
            return {
                "status": "error",
                "kind": "exception",
                "exc_type": type(exc).__name__,
                "message": str(exc),
                "traceback": format_exc(exc, 1),
            }
        if os.getpid() != owner:
            os._exit(0)
        builtins.__dict__.update(builtins_snapshot)
        result = {"status": "ok"}
        if value is not None:
            try:
                text = repr(value)
            except BaseException as exc:
                text = f"<repr failed: {type(exc).__name__}: {exc}>"
            if len(text) > max_repr:
                text = text[:max_repr] + f"... [repr truncated, {len(text)} chars]"
            result["value"] = text
            ns["_"] = value
        return result

    def run_forked(code):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                reply = execute(code, {"__name__": "__main__", "__builtins__": builtins})
                sys.stdout.flush()
                sys.stderr.flush()
                _write_frame(w, reply)
            finally:
                _os_exit(0)
        os.close(w)
        data = b""
        while len(data) <= _MAX_CHILD_REPLY:  # the child is untrusted too: cap what we read
            chunk = _os_read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        try:
            _os_kill(pid, signal.SIGKILL)  # it wrote its reply, or it flooded the pipe
        except OSError:
            pass
        _, status = _os_waitpid(pid, 0)
        try:
            reply = _loads(data[4:]) if len(data) >= 4 else None
        except (ValueError, RecursionError):
            reply = None
        if isinstance(reply, dict) and isinstance(reply.get("status"), str):
            return reply
        return {"status": "crashed", "message": f"the call's process ended (wait status {status})"}

    if fresh:
        # Each call runs in a forked child: the warm parent must stay pristine, so
        # it is not dumpable (no child can open /proc/<parent>/mem or ptrace it).
        PR_SET_DUMPABLE = 4
        _check(_LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    reset_streams()
    ready = {"status": "ready", "pid": _os_getpid()}
    if setup.get("ready_marker"):  # a recycled sandbox's next interpreter says which it is
        ready["marker"] = setup["ready_marker"]
    _write_frame(_CTRL_FD, ready)
    while True:
        try:
            request = _read_frame(stdin_fd)
        except EOFError:
            _os_exit(0)
        reset_streams()
        if "seed" in request:  # the episode's seed: `random` replays the same numbers
            import random

            random.seed(request["seed"])
        if request.get("files"):
            _write_files(setup["workdir"], request["files"], os.getuid(), os.getgid())
        try:
            reply = run_forked(request["code"]) if fresh else execute(request["code"], namespace)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # the agent closed or replaced the streams
                pass
            builtins.__dict__.update(builtins_snapshot)  # undo `del builtins.print` & co
            if supervised:  # kill(-1) would hit our supervisor too: spare it by pid
                _kill_all_but({1, _os_getpid(), os.getppid()})
            elif own_pid_ns:
                try:
                    _os_kill(-1, signal.SIGKILL)  # children the call left behind (not us, not init)
                except OSError:
                    pass
                while True:  # reap our own killed children before answering: none outlive the call
                    try:
                        _os_waitpid(-1, 0)
                    except ChildProcessError:
                        break
                    except OSError:
                        break
            _os_dup2(saved_out, 1)
            _os_dup2(saved_err, 2)
            marker = request["nonce"].encode()
            _os_write(1, marker)
            _os_write(2, marker)
        threads = _thread_count() - 1
        if threads > 0:  # threads the call started are still running: say so
            reply["lingering_threads"] = threads
        reply["nonce"] = request["nonce"]
        _write_frame(_CTRL_FD, reply)
        if reply["status"] == "exit":
            _os_exit(0)


def _kill_all_but(spare):
    """SIGKILL every process in our pid namespace but ``spare``, until none is left
    (a fork bomb's new children are caught by the next pass; the pids cgroup bounds it)."""
    for _ in range(2000):
        victims = [int(n) for n in _os_listdir("/proc") if n.isdigit() and int(n) not in spare]
        if not victims:
            return
        for pid in victims:
            try:
                _os_kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:  # our own children: reap them, or they stay listed as zombies
            try:
                if _os_waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except OSError:
                break


def _run_recycled(setup):
    """Serve episode after episode in this sandbox (``setup["recycle_fds"]``).

    This process stays pristine: it never runs model code and never reads a
    request or a reply into its memory. Each episode's interpreter is a child
    forked from it, which first closes this process's private pipes (so
    nothing the model runs can read or write them; this process is not
    dumpable, so its ``/proc`` entries stay closed too) and then serves the
    host's requests as a fresh sandbox would. When the host ends the episode
    through the private pipe (it sends a fresh marker), this process kills
    every other process of the sandbox, discards whatever is left in the
    request pipe (code the episode planted there for the next interpreter;
    through a reused buffer, zeroed), removes everything the writable places
    did not hold before the first episode, writes the marker to fds 1 and 2
    (the host drops the dead episode's output up to it), forks the next
    interpreter (whose ready message echoes the marker, so no frame the
    episode left on the control pipe passes for it) and answers ``r`` on the
    private pipe. "Did not hold" is judged by metadata, not names: what stays
    (the work dir itself, the roots of the writable places) gets back the
    mode bits, extended attributes (POSIX ACLs among them) and inode flags it
    had before the first episode, and its type and owner must match. If
    anything is left that it cannot remove or restore, the sandbox ends
    instead: the host never reuses a sandbox that is not clean.

    If the episode's interpreter dies while the host is not ending the
    episode (``os._exit``, a signal, a segfault, a resource limit), this
    process ends the sandbox at once: it holds the control pipe too, so
    without that the host would see no end of file and wait out the call's
    whole deadline instead of reporting a crash.
    """
    PR_SET_DUMPABLE = 4
    _check(_LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    ends, acks = setup["recycle_fds"]
    scratch = bytearray(1 << 16)
    marker = None
    # What the writable places hold before any model code ran (the work dir: nothing,
    # the first episode's files aside): after an episode they must hold exactly that.
    work = os.path.relpath(setup["workdir"], "/tmp")
    baseline = {path: _tree(path) for path in _SCRUBBED}
    if baseline["/tmp"] is not None:
        baseline["/tmp"] = {
            p: meta for p, meta in baseline["/tmp"].items() if not p.startswith(work + "/")
        }
    while True:
        child = os.fork()
        if child == 0:
            try:
                os.close(ends)
                os.close(acks)
                os.chdir(setup["workdir"])  # the directory was emptied and made again
                _run_python({**setup, "supervised": True, "ready_marker": marker})
            finally:
                _os_exit(70)
        if marker is not None:
            _os_write(acks, b"r")
        try:
            marker = _await_end(ends, child)
        except EOFError:  # the host is done with this sandbox
            _os_exit(0)
        if marker is None:  # the interpreter died mid-episode: the host must see a crash now
            _os_exit(72)
        try:
            _os_kill(-1, signal.SIGKILL)  # the episode's every process (never us, never init)
        except OSError:
            pass
        _kill_all_but({1, _os_getpid()})
        _discard_pending(0, scratch)
        try:
            for path, kept in baseline.items():
                if kept is not None:
                    _scrub(path, kept)
            clean = all(_tree(path) == kept for path, kept in baseline.items())
        except (OSError, RecursionError):
            clean = False
        if not clean:  # something could not be removed: this sandbox is not reused
            _os_exit(71)
        os.makedirs(setup["workdir"], exist_ok=True)
        _os_write(1, marker)
        _os_write(2, marker)
        marker = marker.decode()


def _discard_pending(fd, scratch):
    """Read and drop what is buffered in the pipe ``fd`` (never blocking), through
    ``scratch``, zeroed after: no copy of it stays in this process's memory."""
    import fcntl

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        while os.readv(fd, [scratch]) > 0:
            pass
    except OSError:  # EAGAIN: empty
        pass
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        scratch[:] = bytes(len(scratch))


def _await_end(ends, child):
    """The host's end-of-episode marker (a line on ``ends``), or ``None`` as soon
    as the interpreter ``child`` has died first. Raises ``EOFError`` when the host
    closed ``ends``. A marker that is there wins over a death seen at the same time."""
    import select

    try:  # a pidfd turns readable when the process ends (Linux 5.3+) ...
        watch = os.pidfd_open(child)
    except (AttributeError, OSError):
        watch = None  # ... else look every 50 ms
    poller = select.poll()
    poller.register(ends, select.POLLIN)
    if watch is not None:
        poller.register(watch, select.POLLIN)
    try:
        while True:
            ready = {fd for fd, _ in poller.poll(None if watch is not None else 50)}
            if ends in ready:
                return _read_line(ends)
            if watch is None:
                if _os_waitpid(child, os.WNOHANG)[0] == child:
                    return None
            elif watch in ready:
                return None
    finally:
        if watch is not None:
            os.close(watch)


def _read_line(fd):
    data = b""
    while not data.endswith(b"\n"):
        chunk = _os_read(fd, 1)
        if not chunk:
            raise EOFError
        data += chunk
        if len(data) > 256:
            raise EOFError
    return data[:-1]


# Where an episode can write (the work dir is under /tmp); read-only mounts are skipped.
_SCRUBBED = ("/tmp", "/dev/shm", "/var/tmp", "/root", "/home")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _open_writable(path):
    """A descriptor of the directory ``path`` on a writable mount, else ``None``."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return None
    if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
        os.close(fd)
        return None
    return fd


def _tree(path):
    """What is under ``path``: relative path -> :func:`_meta` (``""`` is ``path``
    itself), on one mount, by descriptors (no path grows past PATH_MAX); ``None``
    when it is absent or read-only."""
    fd = _open_writable(path)
    if fd is None:
        return None
    try:
        found = {"": _meta(fd, None, os.fstat(fd), fd)}
        _walk(fd, os.fstat(fd).st_dev, "", found)
        return found
    finally:
        os.close(fd)


def _walk(dir_fd, dev, prefix, found):
    for entry in list(os.scandir(dir_fd)):
        info = entry.stat(follow_symlinks=False)
        if info.st_dev != dev:  # a mount point (a bind): not ours to look into
            continue
        if not entry.is_dir(follow_symlinks=False):
            found[prefix + entry.name] = _meta(dir_fd, entry.name, info)
            continue
        try:
            fd = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
        except PermissionError:
            if info.st_uid == os.getuid() or info.st_mode & 0o022:
                raise  # it could hold what we cannot see: not clean
            # a directory of another user that we could never write into
            found[prefix + entry.name] = _meta(dir_fd, entry.name, info)
            continue
        try:
            found[prefix + entry.name] = _meta(dir_fd, entry.name, info, fd)
            _walk(fd, dev, prefix + entry.name + "/", found)
        finally:
            os.close(fd)


# FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (the same numbers on x86_64 and aarch64)
_GETFLAGS, _SETFLAGS = 0x80086601, 0x40086602


def _meta(dir_fd, name, info, own_fd=None):
    """What a next episode could read of an entry, times and contents aside: type and
    mode bits, owner, extended attributes (``user.*``, POSIX ACLs...) and, for a
    directory (``own_fd``), its inode flags (``chattr``)."""
    return (info.st_mode, info.st_uid, info.st_gid, _xattrs(_where(dir_fd, name)), _flags(own_fd))


def _where(dir_fd, name):
    """How xattr calls (which take no ``dir_fd``) name ``name`` in ``dir_fd``: through
    our descriptor of its directory, the link itself not followed; ``None``: the
    directory itself, by its descriptor."""
    if name is None:
        return dir_fd, {}
    return f"/proc/self/fd/{dir_fd}/{name}", {"follow_symlinks": False}


def _xattrs(where):
    import errno

    target, how = where
    try:
        names = os.listxattr(target, **how)
        return tuple(sorted((n, os.getxattr(target, n, **how)) for n in names))
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return ()  # this file system keeps none
        raise  # (not clean)


def _flags(fd):
    import fcntl

    if fd is None:
        return None
    try:
        return _unpack("<i", fcntl.ioctl(fd, _GETFLAGS, bytes(8))[:4])[0]
    except OSError:
        return None  # not supported here: nothing to compare or restore


def _restore(dir_fd, name, kept, own_fd=None):
    """Give an entry that stays back the metadata ``kept`` recorded before the first
    episode (best effort: what is not restored fails the comparison that follows)."""
    import fcntl
    import stat

    target, how = _where(dir_fd, name)
    info = os.stat(target, **how)
    mode, _, _, xattrs, flags = kept
    if stat.S_IFMT(info.st_mode) != stat.S_IFMT(mode) or stat.S_ISLNK(mode):
        return  # another kind of entry (or a link, whose bits do not count): not clean
    if flags is not None and _flags(own_fd) not in (None, flags):  # before chmod: +i blocks it
        fcntl.ioctl(own_fd, _SETFLAGS, _pack("<i", flags) + bytes(4))
    if info.st_mode != mode:
        os.chmod(target, stat.S_IMODE(mode), **how)
    if _xattrs((target, how)) == xattrs:
        return
    wanted = dict(xattrs)
    for attr in os.listxattr(target, **how):
        if attr not in wanted:
            os.removexattr(target, attr, **how)
    for attr, value in wanted.items():
        os.setxattr(target, attr, value, **how)


def _scrub(path, keep):
    """Remove what we can under ``path`` but the relative paths in ``keep``, and give
    what stays the metadata ``keep`` holds for it."""
    fd = _open_writable(path)
    if fd is not None:
        try:
            _try_restore(fd, None, keep[""], fd)
            _scrub_fd(fd, os.fstat(fd).st_dev, "", keep)
        finally:
            os.close(fd)


def _try_restore(dir_fd, name, kept, own_fd=None):
    try:
        _restore(dir_fd, name, kept, own_fd)
    except OSError:
        pass  # left as it is: the comparison with the baseline refuses the sandbox


def _scrub_fd(dir_fd, dev, prefix, keep):
    for entry in list(os.scandir(dir_fd)):
        if entry.stat(follow_symlinks=False).st_dev != dev:
            continue
        relative = prefix + entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                if relative not in keep:
                    os.chmod(entry.name, 0o700, dir_fd=dir_fd)  # made unwritable: still goes
                else:  # its own bits first: a directory made unwritable must be emptied
                    _try_restore(dir_fd, entry.name, keep[relative])
                fd = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    if relative in keep:  # (its flags need a descriptor)
                        _try_restore(dir_fd, entry.name, keep[relative], fd)
                    _scrub_fd(fd, dev, relative + "/", keep)
                finally:
                    os.close(fd)
                if relative not in keep:
                    os.rmdir(entry.name, dir_fd=dir_fd)
            elif relative not in keep:
                os.unlink(entry.name, dir_fd=dir_fd)
            else:
                _try_restore(dir_fd, entry.name, keep[relative])
        except OSError:
            pass  # left in place: the comparison with the baseline refuses the sandbox


def _thread_count():
    try:
        return len(_os_listdir("/proc/self/task"))
    except OSError:
        return 1


def _run_service(setup):
    """Serve requests with a module's handler: ``serve(options) -> handle(payload) -> reply``.

    The module is imported without running its packages' ``__init__`` (they are
    stood in for by empty packages with the right path), so a service pays only
    for what it imports itself.
    """
    import importlib
    import types

    spec = setup["service"]
    for name, path in spec["packages"].items():
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    handle = importlib.import_module(spec["module"]).serve(spec["options"])
    stdin_fd = os.dup(0)
    devnull = os.open("/dev/null", os.O_RDONLY)
    _os_dup2(devnull, 0)
    os.close(devnull)
    _write_frame(_CTRL_FD, {"status": "ready", "pid": _os_getpid()})
    while True:
        try:
            request = _read_frame(stdin_fd)
        except EOFError:
            _os_exit(0)
        try:
            reply = {"status": "ok", "payload": handle(request["payload"])}
        except Exception as exc:  # a bug in the service, reported to the host
            reply = {"status": "error", "message": f"{type(exc).__name__}: {exc}"[:2000]}
        reply["nonce"] = request["nonce"]
        _write_frame(_CTRL_FD, reply)


def _run_bash(setup):
    _write_frame(_CTRL_FD, {"status": "ready", "pid": os.getpid()})
    os.close(_CTRL_FD)
    os.execve("/bin/bash", ["bash", "--noprofile", "--norc"], dict(os.environ))


def _main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        setup = _setup()
    except BaseException as exc:
        _write_frame(
            _CTRL_FD, {"status": "setup_failed", "message": f"{type(exc).__name__}: {exc}"}
        )
        os._exit(70)
    if setup["mode"] == "bash":
        _run_bash(setup)
    elif setup["mode"] == "service":
        _run_service(setup)
    elif setup.get("recycle_fds"):
        _run_recycled(setup)
    else:
        _run_python(setup)


_main()
