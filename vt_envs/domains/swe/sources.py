"""VT-SWE-v0's task sources: mutant tasks of a repository, built once and cached.

:func:`repository_tasks` turns a repository (a directory with a package and
its pytest tests) into a seeded task source: the mutants its tests catch
(:func:`~vt_envs.domains.swe.mutants.build_tasks`), split by mutated
function into train and a fixed held-out test split, each materialized in
the task cache (:func:`~vt_envs.domains.swe.tasks.materialize`). The list of
kept mutants is cached as JSON, keyed by a digest of the repository's files,
the seed and :data:`GENERATOR_VERSION`, so later envs start in milliseconds. A
repository whose files are a default one's pinned release skips the validation
(minutes) by reading its shipped validated list (:mod:`~vt_envs.domains.swe.validated`).

The default repository is ``vtutils``, shipped with VT (``vt_envs/assets/swe``):
a small tested library of interval, text, statistics and container helpers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vt_envs.core.task import TaskList
from vt_envs.domains.swe.mutants import MutantTask, build_tasks, split_tasks
from vt_envs.domains.swe.mutations import Mutation
from vt_envs.domains.swe.tasks import materialize, swe_cache_dir
from vt_envs.domains.swe.validated import find_shipped
from vt_envs.domains.swe.workspace import with_layout
from vt_envs.errors import InvalidConfigError

__all__ = [
    "BUILTIN_REPO",
    "GENERATOR_VERSION",
    "BuildLimits",
    "RepositoryMutants",
    "repository_mutants",
    "repository_tasks",
]

#: Bump when the mutation kinds, the validation rule, the issue text or the task layout
#: change (3: issue texts name no test; 4: bounded builds, validation narrowed to the
#: covering test modules).
GENERATOR_VERSION = 4
BUILTIN_REPO = Path(__file__).resolve().parents[2] / "assets" / "swe" / "vtutils"
# The repositories' tests need no pytest plugin; not loading the host's is ~5x faster.
_FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _digest(repo: Path, files: Sequence[str]) -> str:
    h = hashlib.sha256(f"v{GENERATOR_VERSION}".encode())
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + (repo / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _python_files(repo: Path, under: str) -> list[str]:
    return sorted(
        str(p.relative_to(repo))
        for p in (repo / under).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def _to_json(task: MutantTask) -> dict:
    return dataclasses.asdict(task)


def _from_json(data: dict) -> MutantTask:
    mutation = Mutation(**data["mutation"])
    return MutantTask(
        mutation=mutation,
        fail_to_pass=tuple(data["fail_to_pass"]),
        pass_to_pass=tuple(data["pass_to_pass"]),
        test_files=tuple(data["test_files"]),
        issue_text=data["issue_text"],
    )


def _listing(name: str, key: str, seed: int, limits: BuildLimits, cache: Path) -> Path:
    bounds = f"max{limits.max_tasks}"
    if limits != BuildLimits(max_tasks=limits.max_tasks):  # vtutils' listing keeps its name
        bounds += f"-fn{limits.max_per_function}-runs{limits.max_runs}-n{int(limits.narrow_tests)}"
    return cache / name / f"tasks-{key}-seed{seed}-{bounds}.json"


def _built(repo: Path, name: str, key: str, sources: list[str], tests: list[str], seed: int,
           limits: BuildLimits, cache: Path, validate: bool) -> tuple[list, str]:  # fmt: skip
    """The kept mutants and where they came from: ``"cache"``, ``"shipped"`` or
    ``"validated"`` (``validate``: always)."""
    listing = _listing(name, key, seed, limits, cache)
    if listing.is_file() and not validate:
        return [_from_json(t) for t in json.loads(listing.read_text())], "cache"
    built, origin = None, "shipped"
    if not validate:
        built = find_shipped(name, repo=repo, key=key, seed=seed, limits=limits)
    if built is None:
        test_modules = [t for t in tests if t.rsplit("/", 1)[-1] != "conftest.py"]
        origin = "validated"
        built = build_tasks(
            repo,
            source_paths=sources,
            test_paths=test_modules if limits.narrow_tests else tests,
            seed=seed,
            max_tasks=limits.max_tasks,
            max_per_function=limits.max_per_function,
            max_runs=limits.max_runs,
            narrow_tests=limits.narrow_tests,
            timeout_s=60.0,
            env=_FAST,
        )
    listing.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=listing.parent, prefix=".tasks-")
    with os.fdopen(fd, "w") as f:
        json.dump([_to_json(t) for t in built], f)
    os.replace(temp, listing)
    return built, origin


@dataclass(frozen=True)
class BuildLimits:
    """How much of a repository becomes tasks (:func:`~vt_envs.domains.swe.mutants.build_tasks`).

    Attributes:
        max_tasks: at most this many mutants are kept (``None``: all the tests catch).
        max_per_function: at most this many of one function (``None``: no cap).
        max_runs: at most this many mutant test runs (``None``: no cap).
        narrow_tests: run each mutant against only the test modules covering its file.
    """

    max_tasks: int | None = 60
    max_per_function: int | None = None
    max_runs: int | None = None
    narrow_tests: bool = False


@dataclass(frozen=True)
class RepositoryMutants:
    """A repository's kept mutants (:func:`repository_mutants`).

    Attributes:
        name: the repository's name in task ids and the cache.
        snapshot: the private copy of the repository the tasks are built from.
        key: the digest of its files and :data:`GENERATOR_VERSION` (the cache's key).
        seed, limits: what the build ran with.
        mutants: the mutants its tests catch, in the builder's order.
        origin: ``"cache"``, ``"shipped"`` (a shipped validated list,
            :mod:`~vt_envs.domains.swe.validated`) or ``"validated"`` (its tests ran).
    """

    name: str
    snapshot: Path
    key: str
    seed: int
    limits: BuildLimits
    mutants: list[MutantTask]
    origin: str


def repository_mutants(
    *,
    repo: str | os.PathLike[str] | None = None,
    name: str | None = None,
    source_dir: str | None = None,
    test_dir: str = "tests",
    seed: int = 0,
    limits: BuildLimits | None = None,
    cache: str | os.PathLike[str] | None = None,
    validate: bool = False,
) -> RepositoryMutants:
    """The mutants of ``repo`` its tests catch (see :func:`repository_tasks` for the
    arguments): from the cache, else from a shipped validated list whose key is the
    repository's, else validated (minutes); ``validate``: validated, whatever is cached."""
    root = Path(repo) if repo is not None else BUILTIN_REPO
    package = source_dir or _find_package(root)
    if not (root / test_dir).is_dir() and (root / package / test_dir).is_dir():
        test_dir = f"{package}/{test_dir}"  # tests inside the package (toolz/tests)
    if not (root / package).is_dir() or not (root / test_dir).is_dir():
        raise InvalidConfigError(
            f"{str(root)!r} must hold the package directory {package!r} and the tests "
            f"directory {test_dir!r}; set source_dir= / test_dir="
        )
    name = name or package.rsplit("/", 1)[-1]
    cache_root = Path(cache) if cache is not None else swe_cache_dir()
    # Build from (and keep) a private copy: oracles read the unmutated files from it.
    tests = _python_files(root, test_dir)
    sources = [  # the package's modules, not its tests (which may live inside it)
        p for p in _python_files(root, package) if p not in tests and "/tests/" not in f"/{p}"
    ]
    sources = [p for p in sources if p.rsplit("/", 1)[-1] not in ("_version.py", "conftest.py")]
    key = _digest(root, [*sources, *tests])
    snapshot = cache_root / name / f"source-{key}"
    if not snapshot.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".source-", dir=_ensure(cache_root / name)))
        shutil.copytree(root, staging / "tree", ignore=shutil.ignore_patterns("__pycache__"))
        try:
            (staging / "tree").rename(snapshot)
        except OSError:  # another process made it first
            pass
        shutil.rmtree(staging, ignore_errors=True)
    limits = limits or BuildLimits()
    built, origin = _built(snapshot, name, key, sources, tests, seed, limits, cache_root, validate)
    if not built:
        raise InvalidConfigError(f"no mutant of {str(root)!r} is caught by its tests")
    return RepositoryMutants(name, snapshot, key, seed, limits, built, origin)


def repository_tasks(
    split: str = "train",
    *,
    repo: str | os.PathLike[str] | None = None,
    name: str | None = None,
    source_dir: str | None = None,
    test_dir: str = "tests",
    seed: int = 0,
    max_tasks: int | None = 60,
    test_fraction: float = 0.2,
    cache: str | os.PathLike[str] | None = None,
    limits: BuildLimits | None = None,
    validate: bool = False,
) -> TaskList:
    """The ``split`` of ``repo``'s mutant tasks (default: the built-in ``vtutils``).

    Args:
        repo: a directory holding a package (``source_dir``, default the
            directory named like the repository, its version dropped, at the top or
            under ``src/``) and its tests (``test_dir``, at the top or inside the
            package).
        name: the tasks' name in ids and the cache (default: the package's).
        seed: orders the candidate mutants (and so which are kept).
        max_tasks: at most this many mutants are validated into tasks.
        test_fraction: the share of mutated functions held out.
        cache: the task cache (default :func:`swe_cache_dir`).
        limits: bounds on the build (default: ``max_tasks`` kept, nothing else
            bounded); ``max_tasks`` is ignored when it is given.
        validate: run the tests on every candidate even where the cache or a shipped
            validated list (:mod:`~vt_envs.domains.swe.validated`) already holds the result.
    """
    if split not in ("train", "test"):
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    built = repository_mutants(
        repo=repo, name=name, source_dir=source_dir, test_dir=test_dir, seed=seed,
        limits=limits or BuildLimits(max_tasks=max_tasks), cache=cache, validate=validate,
    )  # fmt: skip
    cache_root = Path(cache) if cache is not None else swe_cache_dir()
    train, test = split_tasks(built.mutants, test_fraction=test_fraction, seed=seed)
    chosen = train if split == "train" else test
    tasks = [
        with_layout(
            materialize(
                built.snapshot, t, name=built.name, split=split, cache=cache_root, test_env=_FAST
            )
        )
        for t in chosen
    ]
    return TaskList(tasks, name=f"swe/{built.name}", split=split)


def _find_package(root: Path) -> str:
    """The package directory of ``root``: its name, or an unpacked sdist's name without
    the version (``toolz-1.0.0`` -> ``toolz``, ``more_itertools-11.2.1`` ->
    ``more_itertools``), at the top or under ``src/``."""
    bare = re.sub(r"-\d[\w.]*$", "", root.name)
    names = dict.fromkeys([root.name, bare, bare.replace("-", "_"), bare.replace("_", "-")])
    for candidate in [*names, *(f"src/{n}" for n in names)]:
        if (root / candidate / "__init__.py").is_file():
            return candidate
    return bare


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
