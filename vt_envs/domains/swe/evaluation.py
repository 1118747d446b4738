"""Hidden-test evaluation of an agent's change, in a fresh sandbox, on the pristine tree.

**The trees.** The agent never sees the hidden tests: they live in the task's
pristine repository in the task cache (hidden from every sandbox, see
:func:`~vt_envs.domains.swe.config.answer_paths`; the agent's working copy was
made without them). The evaluation never runs pytest in the agent's tree
either. It copies the pristine repository and applies to it only the agent's
*source* changes (:func:`agent_changes`): files it edited, added or deleted,
except anything that could steer the test run rather than the code under
test —

- test files (the task's, and any ``test_*.py`` / ``*_test.py`` or file in
  a ``tests`` / ``test`` directory) and every pytest configuration file
  (``conftest.py``, ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``,
  ``.pytest.toml``, ``pyproject.toml``, ``tox.ini``, ``setup.cfg``);
- dotfiles and dot-directories, ``__pycache__`` and compiled files,
  ``*.pth``, ``*.dist-info`` / ``*.egg-info``, ``sitecustomize.py`` /
  ``usercustomize.py``, and new top-level modules (which could shadow
  pytest or the standard library).

The copy is bound read-only into the run's sandbox, so no test process can
change what a later one runs.

**Who decides.** The package code the tests import is the agent's and runs
inside pytest, so whatever that process writes (a JUnit file, its exit
status, its report lines) the agent's code can write too. The verdict is
therefore never read from a report file. The sandbox's Python worker runs
:mod:`~vt_envs.domains.swe.grading_runner`: it imports nothing of the
repository, makes itself non-dumpable, and runs the test ids in a few child
pytest processes (``children``), each reporting every test phase on a pipe
of its own and judged also by its exit status; the runner kills whatever a
child leaves behind before the next starts, and answers the host over the
worker's control pipe, which no child can reach. Inside each child, agent
code can still rewrite that child's reports: so the hidden modules carry
canaries (:mod:`~vt_envs.domains.swe.canaries`) — a random number of clones
of their own tests under names like theirs, in every child: clones that
must fail and twins that must end like their originals. A run whose
canaries misbehave, or whose child exits 0 (each runs a must-fail clone), or
writes a report stream no pytest writes, was tampered with and scores 0.

**What remains possible** (and is not prevented here): code that reads the
hidden test sources during the run (they are in the run's tree, and the
clones in them can be recognised by their bodies) and spares exactly the
canaries; code that makes the hidden tests pass by reading their expected
values (special-casing the tests rather than fixing the bug). Both need the
agent to write, blind, code aimed at tests it never saw; the blunt forms
(every test passed, a rewritten report, ``os._exit(0)``, the named tests
flipped) are caught.

pytest runs with ``-s -P`` (no user site, the repository not first on
``sys.path``; pytest adds it, ``-o pythonpath=.``, and ``src`` in a src
layout), the repository's ``addopts`` dropped (they name plugins the run
does not load), plugin autoloading off and no bytecode written (and none of
the agent's read). Every report is bounded in size and parsed in linear
time inside the sandbox; the host parses one small reply, and does its own
file work in a thread, never on the event loop; the whole run is under
``timeout_s``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import random
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from vt_envs.domains.swe import grading_runner
from vt_envs.domains.swe.canaries import Canary, judge, plant
from vt_envs.domains.swe.files import PathError, SafeRoot
from vt_envs.domains.swe.workspace import SHOWN_AS, Workspace
from vt_envs.sandbox.isolation import Isolation
from vt_envs.sandbox.process import SandboxProcess, WorkerLost

__all__ = [
    "CONFIG_FILES",
    "DEFAULT_CHILDREN",
    "Changes",
    "TestOutcome",
    "agent_changes",
    "run_hidden_tests",
]
#: Files that configure pytest; the agent's versions never reach an evaluation.
CONFIG_FILES = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
_STARTUP_FILES = ("sitecustomize.py", "usercustomize.py")
#: The most files and bytes of changes an evaluation applies (more: refused, scored 0).
MAX_CHANGED_FILES = 2000
MAX_CHANGED_BYTES = 32 << 20
MAX_WALKED = 200_000
_GRADING_HEADROOM_MB, _GRADING_HEADROOM_FILES = 16, 1000
#: Child pytest processes a run is split into (each with its own canaries). Each costs a
#: pytest start and the package's import (~0.25 s); grading the built-in tasks' oracle fix
#: (median of 30): 1 child 0.33 s, 2 children 0.58 s, 3 0.88 s, one per test id 2.7 s
#: (the single JUnit run this replaced: 0.26 s). Two keep each twin in another process
#: than its original.
DEFAULT_CHILDREN = 2
_RUNNER_SOURCE = Path(grading_runner.__file__).read_text(encoding="utf-8")
_MAX_REPLY_CHARS = 4 << 20  # the runner's verdict: a letter per test id and a short tail
# No cache written into the tree, the repository's addopts (plugins not loaded) dropped.
_PYTEST_ARGS = ["-q", "-rfE", "--tb=short", "-p", "no:cacheprovider", "-o", "addopts="]


@dataclass(frozen=True)
class TestOutcome:
    """What the hidden tests did on the agent's change.

    Attributes:
        passed / failed: test ids (``tests/test_x.py::test_y``) by outcome
            (errors and skips count as failed: a test must pass).
        status: ``"ok"``, ``"timeout"``, ``"no_report"`` (the run gave no verdict),
            ``"tampered"`` (see the module docstring; ``reasons`` says what) or
            ``"too_large"`` (the change exceeds :data:`MAX_CHANGED_FILES` /
            :data:`MAX_CHANGED_BYTES`).
        elapsed_s: wall time of the run.
        output: the tail of pytest's output (for ``info``, never for the agent).
        ignored: the agent's changed paths left out (tests, configuration...).
        canaries: how many canary tests ran; children: in how many pytest processes.
        incomplete: children whose canaries did not all report (their tests failed).
        reasons: what showed tampering.
    """

    passed: frozenset[str] = field(default_factory=frozenset)
    failed: frozenset[str] = field(default_factory=frozenset)
    status: str = "ok"
    elapsed_s: float = 0.0
    output: str = ""
    ignored: tuple[str, ...] = ()
    canaries: int = 0
    children: int = 0
    incomplete: int = 0
    reasons: tuple[str, ...] = ()


@dataclass
class Changes:
    """The agent's change to the repository, as files to write and to delete."""

    written: dict[str, bytes] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    too_large: bool = False


def _steers_tests(rel: str, test_files: set[str], pristine: Path) -> bool:
    """Whether an agent's file at ``rel`` could steer the test run (never applied)."""
    parts = PurePosixPath(rel).parts
    name = parts[-1]
    if rel in test_files or name in CONFIG_FILES or name in _STARTUP_FILES:
        return True
    if any(p.startswith(".") or p == "__pycache__" for p in parts):
        return True
    if any(p.endswith((".dist-info", ".egg-info")) for p in parts[:-1]):
        return True
    if name.endswith((".pyc", ".pyo", ".pth")) or name.startswith("test_"):
        return True
    if name.endswith("_test.py") or any(p in ("tests", "test") for p in parts[:-1]):
        return True
    # A new top-level module or package could shadow pytest or the standard library.
    return len(parts) <= 2 and not (pristine / parts[0]).exists()


def agent_changes(files: SafeRoot, pristine: Path, test_files: Sequence[str]) -> Changes:
    """The agent's edits, additions and deletions relative to ``pristine``, minus what
    could steer the test run (see the module docstring)."""
    changes, tests = Changes(), set(test_files)
    seen: set[str] = set()
    size = 0
    for walked, entry in enumerate(files.walk()):
        if walked >= MAX_WALKED:
            changes.too_large = True
            return changes
        if entry.is_dir:
            continue
        seen.add(entry.path)
        if _steers_tests(entry.path, tests, pristine) or files.kind(entry.path) != "file":
            # (Symlinks and fifos are never applied either.)
            if not _unchanged(files, pristine, entry.path):
                changes.ignored.append(entry.path)
            continue
        data = files.read(entry.path, max_bytes=MAX_CHANGED_BYTES)
        original = pristine / entry.path
        if original.is_file() and not original.is_symlink() and original.read_bytes() == data:
            continue
        size += len(data)
        changes.written[entry.path] = data
        if len(changes.written) > MAX_CHANGED_FILES or size > MAX_CHANGED_BYTES:
            changes.too_large = True
            return changes
    for path in sorted(p for p in pristine.rglob("*") if p.is_file() and ".git" not in p.parts):
        rel = str(path.relative_to(pristine))
        if rel not in seen and not _steers_tests(rel, tests, pristine):
            changes.deleted.append(rel)
    return changes


def _unchanged(files: SafeRoot, pristine: Path, rel: str) -> bool:
    original = pristine / rel
    if files.kind(rel) != "file" or not original.is_file() or original.is_symlink():
        return False
    try:
        return files.read(rel, max_bytes=MAX_CHANGED_BYTES) == original.read_bytes()
    except PathError:
        return False


@dataclass
class _Run:
    """A prepared run: the tree to test, and what the children run."""

    copy: Workspace
    changes: Changes
    batches: list[list[str]]
    canaries: list[Canary]


def _prepare(
    agent_copy: Workspace,
    pristine: Path,
    test_ids: Sequence[str],
    test_files: Sequence[str],
    hosts: Sequence[str],
    fail_to_pass: Sequence[str],
    children: int,
    rng: random.Random,
) -> _Run | Changes:
    """The pristine tree plus the agent's change plus the canaries (or the too-large
    :class:`Changes`). Plain file work, run in a thread."""
    changes = agent_changes(agent_copy.files, pristine, test_files)
    if changes.too_large:
        return changes
    # The agent's own bounds (an env that raised them for a large repository grades it),
    # with room for what the agent's copy lacks: the hidden tests and the canaries.
    copy = Workspace(
        pristine,
        disk_quota_mb=(agent_copy.quota_bytes >> 20) + _GRADING_HEADROOM_MB,
        max_files=agent_copy.max_files + _GRADING_HEADROOM_FILES,
    )
    try:
        for rel, data in changes.written.items():
            copy.files.write(rel, data, create_parents=True)
        for rel in changes.deleted:
            copy.files.remove(rel)
        n = max(1, min(children, len(test_ids)))
        texts = {
            rel: (pristine / rel).read_text(encoding="utf-8", errors="replace")
            for rel in hosts
            if (pristine / rel).is_file()
        }
        planted = plant(
            texts,
            test_ids,
            fail_to_pass=fail_to_pass,
            n_fails=sum(rng.randint(1, 2) for _ in range(n)),
            n_twins=rng.randint(1, 3),
            rng=rng,
        )
        for rel, text in planted.texts.items():
            copy.files.write(rel, text.encode("utf-8"))
        batches = _batches(list(test_ids), planted.canaries, n, rng)
        return _Run(copy, changes, batches, planted.canaries)
    except BaseException:
        copy.close()
        raise


def _batches(
    ids: list[str], canaries: Sequence[Canary], n: int, rng: random.Random
) -> list[list[str]]:
    """``ids`` dealt into ``n`` batches (fewer when there are fewer must-fail canaries:
    every batch gets one), twins away from their originals, each batch shuffled."""
    fails = [c for c in canaries if c.kind == "fails"]
    n = max(1, min(n, len(fails))) if fails else 1
    rng.shuffle(ids)
    batches = [ids[i::n] for i in range(n)]
    for i, canary in enumerate(fails):
        batches[i % n if i < n else rng.randrange(n)].append(canary.test_id)
    for twin in (c for c in canaries if c.kind == "twin"):
        home = next((i for i, b in enumerate(batches) if twin.source in b), 0)
        away = [i for i in range(n) if i != home] or [home]
        batches[rng.choice(away)].append(twin.test_id)
    for batch in batches:
        rng.shuffle(batch)
    return [b for b in batches if b]


def _plan(run: _Run, isolation: Isolation, pristine: Path, env: Mapping[str, str],
          timeout_s: float) -> str:  # fmt: skip
    cwd = SHOWN_AS if isolation.sandboxed else str(run.copy.path)
    roots = ". src" if (pristine / "src").is_dir() else "."  # a src/ layout imports from src
    return json.dumps(
        {
            "python": isolation.policy.python,
            "cwd": cwd,
            "env": {
                **env,
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                # Nothing compiled is written, and the tree holds no bytecode of the agent's
                # (caches are never copied from its tree), so only the installed libraries'
                # own caches are read: a fresh cache prefix made pytest recompile itself
                # every run (0.62 s instead of 0.16 s).
                "PYTHONDONTWRITEBYTECODE": "1",
                # The tree is read-only: temporary files (pytest's capture) go to the work dir.
                **({"TMPDIR": isolation.policy.workdir} if isolation.sandboxed else {}),
            },
            "pytest_args": [*_PYTEST_ARGS, "-o", f"pythonpath={roots}", f"--rootdir={cwd}"],
            "batches": run.batches,
            "tokens": [secrets.token_hex(16) for _ in run.batches],
            "timeout_s": timeout_s,
            "own_pid_ns": isolation.sandboxed,
        }
    )


def _read_verdict(reply: Mapping[str, object], n_batches: int) -> dict | None:
    """The runner's verdict from the worker's reply, or ``None`` if it is not one."""
    value = reply.get("value") if reply.get("status") == "ok" else None
    if not isinstance(value, str) or len(value) > _MAX_REPLY_CHARS:
        return None
    try:
        verdict = json.loads(ast.literal_eval(value))  # a str's repr, then JSON
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return None
    batches = verdict.get("batches") if isinstance(verdict, dict) else None
    if not isinstance(batches, list) or len(batches) != n_batches:
        return None
    if not all(isinstance(b, dict) for b in batches):
        return None
    return verdict


async def _run_children(
    run: _Run, isolation: Isolation, plan: str, timeout_s: float
) -> tuple[str, dict | None, str]:
    """``(status, verdict, detail)`` of the runner in a fresh sandbox over the copy."""
    binds = {SHOWN_AS: str(run.copy.path)} if isolation.sandboxed else {}
    proc = await SandboxProcess.start(
        isolation, mode="python", binds=binds, max_repr_chars=_MAX_REPLY_CHARS
    )
    try:
        code = f"{_RUNNER_SOURCE}\nrun_plan({plan!r})\n"
        reply, _, err = await proc.execute({"code": code}, timeout_s)
    except WorkerLost as lost:
        return ("timeout" if lost.kind == "timeout" else "no_report"), None, lost.detail
    finally:
        await proc.kill()
    verdict = await asyncio.to_thread(_read_verdict, reply, len(run.batches))  # (<= 4 MB)
    if verdict is None:
        detail = f"{reply.get('exc_type', '')}: {reply.get('message', '')}"[:2000]
        return "no_report", None, detail + err.data.decode("utf-8", "replace")[-2000:]
    return "ok", verdict, ""


async def run_hidden_tests(
    agent_copy: Workspace,
    *,
    pristine: Path,
    test_ids: Sequence[str],
    test_files: Sequence[str],
    isolation: Isolation,
    timeout_s: float = 60.0,
    test_env: Mapping[str, str] | None = None,
    hidden_files: Sequence[str] | None = None,
    fail_to_pass: Sequence[str] = (),
    children: int = DEFAULT_CHILDREN,
    rng: random.Random | None = None,
) -> TestOutcome:
    """Run ``test_ids`` (from ``test_files``) on ``pristine`` plus the agent's change.

    ``pristine``: the task's repository before the agent, hidden tests
    included. The interpreter is the sandbox's (``isolation.policy.python``);
    pytest must be importable by it. ``test_env``: variables for the run, the
    same the task was validated with. ``hidden_files``: the test modules the
    agent never saw, where canaries go (default: ``test_files``);
    ``fail_to_pass``: the ids the canaries are preferably cloned from.
    ``children``: pytest processes the ids are split into. ``rng``: draws the
    canaries and batches (default: the system's random source).
    Everything, the sandbox's start included, ends within ``timeout_s``.
    """
    started = time.monotonic()
    rng = rng or random.SystemRandom()
    everything = frozenset(test_ids)
    hosts = [f for f in (test_files if hidden_files is None else hidden_files) if f in test_files]
    prepared: _Run | Changes | None = None
    try:
        async with asyncio.timeout(timeout_s + 2.0):  # a backstop: the parts have their own
            prepared = await asyncio.to_thread(
                _prepare, agent_copy, pristine, test_ids, test_files, hosts, fail_to_pass,
                children, rng,
            )  # fmt: skip
            if isinstance(prepared, Changes):
                return TestOutcome(frozenset(), everything, "too_large")
            left = timeout_s - (time.monotonic() - started)
            plan = _plan(prepared, isolation, pristine, test_env or {}, max(left - 1.5, 0.5))
            status, verdict, detail = await _run_children(prepared, isolation, plan, left)
    except TimeoutError:
        status, verdict, detail = "timeout", None, ""
    finally:
        if isinstance(prepared, _Run):
            await asyncio.to_thread(prepared.copy.close)
    elapsed = time.monotonic() - started
    ignored = tuple(prepared.changes.ignored) if isinstance(prepared, _Run) else ()
    if verdict is None:
        return TestOutcome(frozenset(), everything, status, elapsed, detail, ignored)
    run = prepared
    letters, reasons, incomplete = judge(run.batches, verdict["batches"], run.canaries)
    counts = {"canaries": len(run.canaries), "children": len(run.batches)}
    tail = str(verdict.get("tail", ""))[-2000:]
    if reasons:
        return TestOutcome(frozenset(), everything, "tampered", elapsed, tail, ignored,
                           **counts, incomplete=incomplete, reasons=tuple(reasons))  # fmt: skip
    passed = frozenset(t for t in everything if letters.get(t) == "P")
    status = "timeout" if any(v.get("exit") is None for v in verdict["batches"]) else "ok"
    return TestOutcome(passed, everything - passed, status, elapsed, tail, ignored, **counts,
                       incomplete=incomplete)  # fmt: skip
