"""VT-SWE-v0's default repositories: pinned sdists of tested pure-Python packages.

:data:`DEFAULT_REPOS` is the one place their versions live: each entry names a
package's source release by exact version and the sha256 of its archive, the
package and tests directories inside it, and the bounds its mutant build runs
under (:class:`~vt_envs.domains.swe.sources.BuildLimits`). The same entry on any
machine gives the same tasks; a file that differs from the pinned one is refused
(by pip's hash-checking mode, before its build backend runs, and again here).

:func:`ensure_repo` fetches an entry's sdist with pip into the SWE task cache
(``$VT_CACHE_DIR/swe/repos/<name>-<version>``, where no sandbox can read it) once;
``python -m vt_envs.domains.swe.fetch --defaults`` fetches them all and builds
their tasks (``make test`` runs it at install). Without it, the first
``gym.make("VT-SWE-v0")`` fetches them; when that fails (offline, no index) it
raises :class:`RepositoryUnavailableError` and never falls back to another task
set, whose scores would mean something else.

``vtutils`` (shipped with VT, nothing to fetch) is a default repository too
(:data:`DEFAULT_REPO_NAMES`).

Each default repository's validated mutants ship with VT
(``vt_envs/assets/swe/validated-<name>[-<version>].json``,
:mod:`~vt_envs.domains.swe.validated`), so building its tasks takes seconds, not the
minutes its tests take over every candidate mutant; ``python -m
vt_envs.domains.swe.fetch --defaults --validate --write-shipped`` regenerates them
(after a change to a pinned version, the mutations or the generator).

Left out, measured: ``more-itertools`` (its suite runs 765 tests and 21,194
subtests in 61 s here, ``tests/test_more.py`` alone, which covers ``more.py``,
in 27 s, so each mutant's validation would take half a minute or more).
"""

from __future__ import annotations

import difflib
import hashlib
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vt_envs.domains.swe.fetch import fetch_sdist
from vt_envs.domains.swe.sources import BuildLimits, RepositoryMutants, repository_mutants
from vt_envs.domains.swe.tasks import swe_cache_dir
from vt_envs.domains.swe.validated import dumps, shipped_path
from vt_envs.errors import InvalidConfigError, VTError

__all__ = [
    "BUILTIN",
    "BUILTIN_LIMITS",
    "DEFAULT_REPOS",
    "DEFAULT_REPO_NAMES",
    "RepoSpec",
    "RepositoryUnavailableError",
    "default_mutants",
    "ensure_repo",
    "repo_dir",
    "resolve_repos",
    "write_shipped",
]

#: The repository shipped with VT (``vt_envs/assets/swe/vtutils``).
BUILTIN = "vtutils"
#: Its build: all its tests run per mutant (0.3 s), at most 3 mutants a function.
BUILTIN_LIMITS = BuildLimits(max_tasks=60, max_per_function=3)


class RepositoryUnavailableError(VTError, RuntimeError):
    """Raised when a default repository is not in the cache and cannot be fetched."""


@dataclass(frozen=True)
class RepoSpec:
    """One pinned sdist and how its tasks are built.

    Attributes:
        name: the repository's name in task ids (``swe/<name>/<split>/<mutation>``).
        requirement: the package's name on the index (``more-itertools``).
        version: the exact version fetched.
        sha256: the sdist archive's digest; a different file is refused.
        source_dir, test_dir: the package and its tests inside the unpacked sdist.
        limits: bounds of the mutant build (kept tasks, mutants per function, test runs,
            test modules run per mutant).
    """

    name: str
    requirement: str
    version: str
    sha256: str
    source_dir: str
    test_dir: str
    limits: BuildLimits

    @property
    def pinned(self) -> str:
        return f"{self.requirement}=={self.version}"


# Each is built with at most 3 mutants a function (a spread of functions in both splits)
# and each mutant runs only the test modules covering its file; build times in docs/envs/swe.md.
_LIMITS = BuildLimits(max_tasks=30, max_per_function=3, max_runs=60, narrow_tests=True)

#: The default repositories fetched from the package index, by name.
DEFAULT_REPOS: dict[str, RepoSpec] = {
    spec.name: spec
    for spec in (
        RepoSpec(
            "toolz", "toolz", "1.2.0",
            "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490",
            "toolz", "toolz/tests", _LIMITS,
        ),
        RepoSpec(
            "parse", "parse", "1.22.4",
            "706d458feed5a81b02768d3156e8070baf6cee7d150a3a3c0cd43101a875c3b5",
            "parse", "tests", _LIMITS,
        ),
        RepoSpec(
            "boltons", "boltons", "26.2.0",
            "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c",
            "boltons", "tests", _LIMITS,
        ),
        RepoSpec(
            "cachetools", "cachetools", "8.0.2",
            "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0",
            "src/cachetools", "tests", _LIMITS,
        ),
    )
}  # fmt: skip

#: What ``gym.make("VT-SWE-v0")`` builds its tasks from, in this order.
DEFAULT_REPO_NAMES: tuple[str, ...] = (BUILTIN, *DEFAULT_REPOS)


def resolve_repos(repos: Sequence[str] | None) -> list[str]:
    """``repos`` checked against the known names (default :data:`DEFAULT_REPO_NAMES`).

    Raises:
        InvalidConfigError: ``repos`` is a string, empty, or names an unknown repository
            (the message lists the known ones, with a "did you mean").
    """
    if repos is None:
        return list(DEFAULT_REPO_NAMES)
    if isinstance(repos, str) or not repos:
        raise InvalidConfigError(
            f"repos must be a non-empty list of names from {list(DEFAULT_REPO_NAMES)}, "
            f"got {repos!r}; e.g. repos=['toolz']"
        )
    for name in repos:
        if name not in DEFAULT_REPO_NAMES:
            close = difflib.get_close_matches(str(name), DEFAULT_REPO_NAMES, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise InvalidConfigError(
                f"unknown repository {name!r} in repos=; known: {list(DEFAULT_REPO_NAMES)}."
                f"{hint} For a repository of your own pass repo='path/to/it' instead."
            )
    return list(dict.fromkeys(repos))


def repo_dir(spec: RepoSpec, cache: Path) -> Path:
    """Where ``spec``'s unpacked sdist lives in the SWE task cache ``cache``."""
    return cache / "repos" / f"{spec.name}-{spec.version}"


def ensure_repo(spec: RepoSpec, cache: Path) -> Path:
    """``spec``'s unpacked sdist in ``cache`` (fetched with pip the first time).

    Raises:
        RepositoryUnavailableError: pip could not download it (offline, no index, no
            such version) or the archive's sha256 differs from the pinned one.
    """
    target = repo_dir(spec, cache)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".fetch-{spec.name}-", dir=target.parent) as tmp:
        try:
            tree = fetch_sdist(spec.pinned, Path(tmp), sha256=spec.sha256)
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            said = (getattr(exc, "stderr", None) or "").strip()[-800:]
            raise RepositoryUnavailableError(
                f"VT-SWE-v0's default repository {spec.name!r} ({spec.pinned}, sha256 "
                f"{spec.sha256[:12]}...) is not in the cache {str(cache)!r} and could not be "
                f"fetched: {exc}{' pip said: ' + said if said else ''}. Fetch the defaults "
                "where the package index is reachable "
                "(`python -m vt_envs.domains.swe.fetch --defaults`, same VT_CACHE_DIR), or "
                "choose repositories already there (repos=['vtutils'] needs no download)."
            ) from exc
        digest = _sha256(next(Path(tmp, ".downloads").iterdir()))
        if digest != spec.sha256:  # pip checked it too; a second look costs nothing
            raise RepositoryUnavailableError(
                f"{spec.pinned}: the downloaded sdist's sha256 is {digest}, expected "
                f"{spec.sha256}; refused (a changed file would change the tasks)"
            )
        try:
            tree.rename(target)
        except OSError:  # another process fetched it first
            if not target.is_dir():
                raise
    return target


def default_mutants(name: str, *, seed: int = 0, validate: bool = False) -> RepositoryMutants:
    """The kept mutants of default repository ``name`` (fetched first; from the cache,
    its shipped validated list, or validated: see
    :func:`~vt_envs.domains.swe.sources.repository_mutants`).

    Raises:
        InvalidConfigError: ``name`` is no default repository.
        RepositoryUnavailableError: it is neither cached nor fetchable.
    """
    (name,) = resolve_repos([name])
    if name == BUILTIN:
        return repository_mutants(seed=seed, limits=BUILTIN_LIMITS, validate=validate)
    spec = DEFAULT_REPOS[name]
    return repository_mutants(
        repo=ensure_repo(spec, swe_cache_dir()), name=spec.name, source_dir=spec.source_dir,
        test_dir=spec.test_dir, seed=seed, limits=spec.limits, validate=validate,
    )  # fmt: skip


def write_shipped(built: RepositoryMutants, directory: Path | None = None) -> Path:
    """Write ``built`` (a default repository's mutants) as its shipped validated list
    (:func:`~vt_envs.domains.swe.validated.shipped_path`, or the same name in
    ``directory``); returns the file."""
    spec = DEFAULT_REPOS.get(built.name)
    version = spec.version if spec is not None else None
    path = shipped_path(built.name, version)
    path = directory / path.name if directory is not None else path
    path.write_text(dumps(built.mutants, repo=built.snapshot, name=built.name, key=built.key,
                          seed=built.seed, limits=built.limits, version=version))  # fmt: skip
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
