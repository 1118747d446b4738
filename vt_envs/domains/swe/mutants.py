"""Mutant tasks: the mutants a repository's tests catch, with an issue text that hides the fix.

:func:`validate` keeps a mutant only if the tests catch it: at least one test
that passed on the clean repository stops passing (FAIL_TO_PASS) and at least
one still passes (PASS_TO_PASS). The kept :class:`MutantTask` carries an issue
text (:func:`issue_text`) describing the failure without revealing the
mutated code, nor which tests judge the fix. :func:`build_tasks` does it all
for a repository, seeded; :func:`split_tasks` holds out whole functions, so no
test task's function is ever trained on. Every test run happens in a temporary copy of the
repository: the caller's checkout is never written to.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import itertools
import random
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vt_envs.domains.swe.mutations import Mutation, candidate_mutations, mutation_order
from vt_envs.domains.swe.test_runs import NOT_COPIED, TestReport, run_tests
from vt_envs.errors import InvalidConfigError

__all__ = [
    "MutantTask",
    "build_tasks",
    "covering_tests",
    "issue_text",
    "split_tasks",
    "validate",
]


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class MutantTask:
    """A mutant the tests catch: the bug to fix, and the tests that judge the fix.

    Attributes:
        mutation: the bug (its ``mutant_source`` is the broken file).
        fail_to_pass: tests that pass on the clean repository and not on the mutant
            (they failed, errored, or their module no longer imports); a fix makes them pass.
        pass_to_pass: tests that pass on both; a fix must not break them.
        test_files: the test modules that judge the task (for now: the test paths given).
        issue_text: the bug report shown to the agent (see :func:`issue_text`).
    """

    mutation: Mutation
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_files: tuple[str, ...]
    issue_text: str


@contextlib.contextmanager
def _working_copy(repo: Path) -> Iterator[Path]:
    """A temporary copy of ``repo`` (without caches, VCS data and virtualenvs)."""
    with tempfile.TemporaryDirectory(prefix="vt-swe-") as scratch:
        copy = Path(scratch) / Path(repo).resolve().name
        shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
        yield copy


def _require_clean(baseline: TestReport) -> None:
    if baseline.timed_out:
        problem = "timed out"
    elif baseline.failed or baseline.errors:
        problem = f"had failures or errors: {sorted(baseline.failed | baseline.errors)[:10]}"
    elif not baseline.passed:
        problem = "ran no test"
    else:
        return
    raise InvalidConfigError(
        f"the baseline test run must pass every test it runs (at least one), but it {problem}. "
        "Fix the repository, or choose test_paths that pass; the run's output ends with:\n"
        f"{baseline.output_tail[-1500:]}"
    )


def validate(
    repo: Path,
    mutation: Mutation,
    test_paths: Sequence[str],
    *,
    baseline: TestReport,
    timeout_s: float,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> MutantTask | None:
    """Run ``test_paths`` on a temporary copy of ``repo`` with ``mutation`` applied.

    Returns the task if the tests catch the mutant: the run did not time out, at
    least one test of ``baseline.passed`` no longer passes (FAIL_TO_PASS) and at
    least one still does (PASS_TO_PASS); else ``None``. ``python`` and ``env`` are
    :func:`run_tests`'.

    Raises:
        InvalidConfigError: ``baseline`` did not pass every test it ran (a mutant is
            judged only against a clean repository), or ``mutation.path`` is not a
            file of ``repo``.
    """
    _require_clean(baseline)
    with _working_copy(repo) as copy:
        target = copy / mutation.path
        if not target.is_file():
            raise InvalidConfigError(
                f"mutation {mutation.id} is of {mutation.path!r}, which is not a file of {repo}"
            )
        target.write_bytes(mutation.mutant_source.encode("utf-8"))
        report = run_tests(copy, test_paths, timeout_s=timeout_s, python=python, env=env)
    if report.timed_out:
        return None  # an infinite loop is not a bug an agent can be judged on in time
    fail_to_pass = tuple(sorted(baseline.passed - report.passed))
    pass_to_pass = tuple(sorted(baseline.passed & report.passed))
    if not fail_to_pass or not pass_to_pass:
        return None
    task = MutantTask(mutation, fail_to_pass, pass_to_pass, tuple(test_paths), issue_text="")
    return dataclasses.replace(task, issue_text=issue_text(task, report, repo=repo))


def _source_files(repo: Path, source_paths: Sequence[str]) -> list[str]:
    """The ``.py`` files named by ``source_paths`` (files or directories), sorted."""
    if not source_paths or isinstance(source_paths, str):
        raise InvalidConfigError(
            f"source_paths must be a non-empty list of files or directories relative to the "
            f"repository, got {source_paths!r}"
        )
    files = set()
    for rel in source_paths:
        path = repo / rel
        if path.is_file():
            files.add(path.relative_to(repo).as_posix())
        elif path.is_dir():
            skipped = {n for n in NOT_COPIED if not n.startswith("*")}
            for found in path.rglob("*.py"):
                if not skipped & set(found.relative_to(repo).parts):
                    files.add(found.relative_to(repo).as_posix())
        else:
            raise InvalidConfigError(f"source path {rel!r} is not a file or directory of {repo}")
    return sorted(files)  # sorted: the shuffle must not depend on the filesystem's order


def build_tasks(
    repo: Path,
    *,
    source_paths: Sequence[str],
    test_paths: Sequence[str],
    seed: int,
    max_tasks: int | None = None,
    max_per_function: int | None = None,
    max_runs: int | None = None,
    narrow_tests: bool = False,
    timeout_s: float,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> list[MutantTask]:
    """The mutants of ``source_paths`` that ``test_paths`` catch, at most ``max_tasks``.

    Runs the tests once on a clean copy (the baseline), proposes
    :func:`candidate_mutations` for every ``.py`` file of ``source_paths`` (files
    or directories, relative to ``repo``), shuffles them with
    ``random.Random(seed)`` and :func:`validate`\\ s them in that order until
    ``max_tasks`` are kept (``None``: all). A candidate whose file text equals the
    original, or one already tried, is skipped without a run (a duplicate of a
    rejected mutant would be rejected too). The same repository, arguments and
    seed give the same tasks, returned sorted by file, line, column and kind.

    Bounds on the work, for large repositories: ``max_per_function`` keeps at
    most that many mutants of one function (so a few long functions do not make
    most tasks, and a held-out function is not a large share of the test split);
    ``max_runs`` stops after that many mutant test runs; ``narrow_tests`` runs
    each mutant against only the test modules that cover its function
    (:func:`covering_tests`) instead of all of ``test_paths`` (which must then
    be files), judged against the baseline's outcomes of those modules, and
    stops a mutant's run at three times the baseline's duration (at least 10 s,
    at most ``timeout_s``): an infinite loop is dropped sooner.

    Raises:
        InvalidConfigError: bad arguments, a source file that does not parse, or a
            baseline that does not pass every test it runs.
    """
    repo = Path(repo).resolve()
    if max_tasks is not None and max_tasks < 1:
        raise InvalidConfigError(f"max_tasks must be >= 1 or None (all), got {max_tasks!r}")
    files = _source_files(repo, source_paths)
    options = {"timeout_s": timeout_s, "python": python, "env": env}
    with _working_copy(repo) as copy:
        baseline = run_tests(copy, test_paths, **options)
    _require_clean(baseline)
    if narrow_tests:  # a mutant that loops forever costs 3x the whole suite, not timeout_s
        options["timeout_s"] = min(timeout_s, max(10.0, 3 * baseline.duration_s))
    originals, candidates = {}, []
    for rel in files:
        try:
            originals[rel] = (repo / rel).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidConfigError(f"source file {rel!r} is not UTF-8 text") from None
        candidates.extend(candidate_mutations(originals[rel], rel))
    random.Random(seed).shuffle(candidates)
    tried, kept, per_function = set(), [], Counter()
    for mutation in candidates:
        if max_tasks is not None and len(kept) >= max_tasks:
            break
        if max_runs is not None and len(tried) >= max_runs:
            break
        function = (mutation.path, mutation.function)
        if max_per_function is not None and per_function[function] >= max_per_function:
            continue
        key = (mutation.path, mutation.mutant_source)
        if key in tried or mutation.mutant_source == originals[mutation.path]:
            continue
        tried.add(key)
        paths, judged = test_paths, baseline
        if narrow_tests:
            paths = covering_tests(repo, mutation.path, test_paths, mutation.function)
            judged = dataclasses.replace(
                baseline, passed=frozenset(t for t in baseline.passed if t.split("::")[0] in paths)
            )
        task = validate(repo, mutation, paths, baseline=judged, **options)
        if task is not None:
            kept.append(task)
            per_function[function] += 1
    return sorted(kept, key=lambda task: mutation_order(task.mutation))


def covering_tests(
    repo: Path, source: str, test_paths: Sequence[str], function: str | None = None
) -> list[str]:
    """The test modules of ``test_paths`` that cover ``function`` of the source file
    ``source``: those whose file name or text names its module (``boltons/strutils.py``:
    ``test_strutils.py`` and any test that says ``strutils``) or, given ``function``, the
    function or its class (``LRUCache.popitem``: ``LRUCache`` or ``popitem``; the way in
    to a package's ``__init__.py``, whose module name no test says); all of them when
    none does. A mutant's failures outside these are not looked for."""
    modules = [p for p in test_paths if re.search(r"(^|/)(test_[^/]*|[^/]*_test)\.py$", p)]
    if not modules:
        return list(test_paths)
    names = {Path(source).stem.lstrip("_")} - {"init__"}
    if function:
        parts = function.split(".")
        names |= {n for n in (parts[0], parts[-1]) if not n.startswith("__")}
    if not names:
        return modules
    alternatives = "|".join(map(re.escape, sorted(names)))
    word = re.compile(rf"(?<![A-Za-z0-9])({alternatives})(?![A-Za-z0-9])")
    chosen = [
        p for p in modules
        if word.search(Path(p).stem) or word.search((repo / p).read_text(errors="replace"))
    ]  # fmt: skip
    return chosen or modules


def split_tasks(
    tasks: Sequence[MutantTask], test_fraction: float = 0.2, *, seed: int
) -> tuple[list[MutantTask], list[MutantTask]]:
    """``(train, test)``: about ``test_fraction`` of the mutated *functions* are held out,
    with all their mutants, so no test task's function is ever trained on.

    The fraction counts functions, not tasks. With two or more functions and a
    fraction above 0, each split gets at least one. The held-out functions are
    drawn across files in turn (a shuffled function of each file, then a second
    of each, ...), so the test split spans the repository's files rather than
    one file's. Deterministic given ``seed``; each split keeps the order of ``tasks``.

    Raises:
        InvalidConfigError: ``test_fraction`` is not in ``[0, 1)``.
    """
    if not 0 <= test_fraction < 1:
        raise InvalidConfigError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    functions = sorted({(t.mutation.path, t.mutation.function) for t in tasks})
    random.Random(seed).shuffle(functions)
    by_file: dict[str, list[tuple[str, str]]] = {}
    for function in functions:  # files in the order their first function was drawn
        by_file.setdefault(function[0], []).append(function)
    rounds = itertools.zip_longest(*by_file.values())
    functions = [f for round_ in rounds for f in round_ if f is not None]
    n_test = round(len(functions) * test_fraction)
    if test_fraction > 0 and len(functions) > 1:
        n_test = min(max(n_test, 1), len(functions) - 1)
    held_out = set(functions[:n_test])
    train = [t for t in tasks if (t.mutation.path, t.mutation.function) not in held_out]
    test = [t for t in tasks if (t.mutation.path, t.mutation.function) in held_out]
    return train, test


# --------------------------------------------------------------------------- issue text

_ASSERT_EQUAL = re.compile(r"^(?:AssertionError: )?assert (?P<got>.+?) == (?P<want>.+)$")
_WHERE = re.compile(r"^\+\s*where (?P<got>.+?) = (?P<call>.+)$")
_METHOD_OF = re.compile(r"^<(?:[\w.]*\.)?(\w+) object>\.(\w+)$")  # "<pkg.mod.Tally object>.add"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in default reprs: differs from run to run
_MAX_QUOTED_LINES, _MAX_LINE_CHARS = 6, 200


def _forbidden(mutation: Mutation) -> list[re.Pattern]:
    """What an issue text must not contain: any line of the original or mutated code,
    and the mutation's file and line together."""
    lines = {
        line.strip() for code in (mutation.original, mutation.mutated) for line in code.splitlines()
    }
    patterns = [
        # A bare word (``pass``, a variable) is matched as a word, not inside others.
        re.compile(rf"\b{re.escape(line)}\b" if re.fullmatch(r"\w+", line) else re.escape(line))
        for line in sorted(lines)
        if line
    ]
    where = re.escape(mutation.path) + rf"(?::|\"?, line ){mutation.lineno}\b"
    return [*patterns, re.compile(where), re.compile(rf"\bline {mutation.lineno}\b")]


def _leaks(text: str, forbidden: Sequence[re.Pattern]) -> bool:
    return any(pattern.search(text) for pattern in forbidden)


def _package_of(path: str) -> str:
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 1:
        parts = parts[1:]
    return parts[0].removesuffix(".py")


def _failure_lines(task: MutantTask, report: TestReport) -> tuple[str | None, list[str]]:
    """The first failing FAIL_TO_PASS test (in execution order) and its message's lines."""
    failing = set(task.fail_to_pass)
    first = next((t for t, m in report.messages.items() if t in failing and m), None)
    if first is None:  # no message (or the module failed to import): any message, or E lines
        first = next((t for t, m in report.messages.items() if m), None)
    if first is not None:
        message = report.messages[first]
    else:
        message = "\n".join(
            line[1:].strip() for line in report.output_tail.splitlines() if line.startswith("E ")
        )
    message = _ADDRESS.sub("", message)
    lines = [line.rstrip()[:_MAX_LINE_CHARS] for line in message.splitlines() if line.strip()]
    return (first if first in failing else None), lines[:_MAX_QUOTED_LINES]


def _calling_sentence(lines: Sequence[str]) -> str | None:
    """``"Calling `f(1)` returns 4, but 5 is expected."`` from an ``assert 4 == 5`` message
    (``Tally.add(...)`` where pytest's explanation says ``add`` is a ``Tally``'s method)."""
    match = _ASSERT_EQUAL.match(lines[0].strip()) if lines else None
    if match is None:
        return None
    got, want = match.group("got"), match.group("want")
    wheres = [w for w in (_WHERE.match(line.strip()) for line in lines[1:]) if w]
    call = next((w.group("call") for w in wheres if w.group("got") == got), None)
    if call is None:
        return None
    for where in wheres:
        method = _METHOD_OF.match(where.group("call"))
        if method and where.group("got") == method.group(2) and call.startswith(f"{method[2]}("):
            call = f"{method.group(1)}.{call}"
            break
    return f"Calling `{call}` returns {got}, but {want} is expected."


def _test_names(task: MutantTask) -> list[re.Pattern]:
    """The judging tests' ids and function names, which an issue text never shows."""
    names = {*task.fail_to_pass, *task.pass_to_pass}
    names |= {t.split("::")[-1].split("[")[0] for t in names}
    return [re.compile(rf"(?<![\w.]){re.escape(n)}(?![\w])") for n in sorted(names) if n]


def _called_api(repo: Path, task: MutantTask) -> list[str]:
    """Names the failing tests call that their modules import from the package (what a
    user of the package would say they called), in order of first use."""
    package = _package_of(task.mutation.path)
    found: dict[str, None] = {}
    for test_id in task.fail_to_pass:
        module, _, rest = test_id.partition("::")
        name = rest.split("::")[-1].split("[")[0]
        try:
            tree = ast.parse((repo / module).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        api = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                for call in ast.walk(node):
                    func = call.func if isinstance(call, ast.Call) else None
                    if isinstance(func, ast.Name) and func.id in api:
                        found.setdefault(func.id)
    return list(found)


def issue_text(task: MutantTask, report: TestReport, *, repo: Path | None = None) -> str:
    """A bug report for ``task`` from the mutant's test run ``report``.

    It names the package and states the wrong behaviour by quoting the first
    failing test's failure message (as "Calling `f(x)` returns X, but Y is
    expected." where the assertion says so; else, given ``repo``, naming what of
    the package the failing tests call). It never contains a line of
    ``task.mutation.original`` or ``.mutated``, nor the mutation's file with
    its line number, nor the id or name of any test that judges the fix (nor
    how many there are): any sentence or quoted line that would is left out.

    Why no test ids: SWE-bench shows the agent the issue as its users wrote it
    (``problem_statement``) and keeps FAIL_TO_PASS / PASS_TO_PASS for the
    harness; SWE-smith's issue generator tells its writer not to mention pytest
    or which test failed, and to give a reproduction instead
    (``configs/issue_gen/ig_v2.yaml``). Here the ids would also tell code
    planted in the package exactly which outcomes to rewrite during grading,
    and their number which canaries are not real tests
    (:mod:`~vt_envs.domains.swe.canaries`). The failure itself — the call and
    the result it should have — is what a bug report gives, and what the agent
    needs to reproduce the bug.
    """
    forbidden = _forbidden(task.mutation)
    package = f"`{_package_of(task.mutation.path)}`"
    if _leaks(package, forbidden):
        package = "the package"
    _, lines = _failure_lines(task, report)
    hidden = [*forbidden, *_test_names(task)]
    lines = [line for line in lines if not _leaks(line, hidden)]
    parts = [f"Bug report: {package} misbehaves."]
    sentence = _calling_sentence(lines)
    if sentence and not _leaks(sentence, hidden):
        parts.append(sentence)
    elif repo is not None:
        api = [f"`{name}`" for name in _called_api(repo, task) if not _leaks(name, hidden)]
        if api:
            parts.append(f"It shows when calling {', '.join(api[:3])}.")
    if lines:
        parts.append("A check of it fails with:\n" + "\n".join(f"    {line}" for line in lines))
    parts.append(f"Fix {package} so that it behaves as expected, without breaking what works now.")
    text = "\n\n".join(parts)
    # A last guard, for a leak no single part showed (one spanning two parts).
    return text if not _leaks(text, hidden) else parts[0]
