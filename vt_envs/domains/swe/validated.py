"""Shipped validated mutant lists: VT-SWE-v0's default repositories built without
running their tests.

Validating a repository's candidate mutants (running its tests against each,
:func:`~vt_envs.domains.swe.mutants.build_tasks`) takes minutes; its result
depends only on the repository's files, :data:`~vt_envs.domains.swe.sources.
GENERATOR_VERSION`, the seed and the build limits. A shipped list
(``vt_envs/assets/swe/validated-<name>-<version>.json``) holds one default
repository's kept mutants exactly as a validated build keeps them, less two
things that make it large: each mutant file's text (stored as the one span of
the pinned file it replaces, and its digest) and the repetition in PASS_TO_PASS
(stored as runs into one table of test ids).

A list is used only when its ``key`` (the digest of the repository's files and
the generator version that the builder caches under), its seed and its limits
are the build's, and every mutant file it rebuilds has its digest; otherwise the build
validates as before. ``python -m vt_envs.domains.swe.fetch --defaults --validate
--write-shipped`` regenerates the lists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vt_envs.domains.swe.mutants import MutantTask
from vt_envs.domains.swe.mutations import Mutation

__all__ = ["FORMAT_VERSION", "SHIPPED_DIR", "dumps", "find_shipped", "loads", "shipped_path"]

#: Bump when the file's layout changes (older files are then ignored: builds validate).
FORMAT_VERSION = 1
#: Where the lists live (``assets/*/*.json`` is package data).
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "swe"
_log = logging.getLogger(__name__)


def shipped_path(name: str, version: str | None = None) -> Path:
    """The shipped list of repository ``name`` (at ``version``; none for vtutils)."""
    return SHIPPED_DIR / f"validated-{name}{'-' + version if version else ''}.json"


def dumps(mutants: Sequence[MutantTask], *, repo: Path, name: str, key: str, seed: int,
          limits: Any, version: str | None = None) -> str:  # fmt: skip
    """The shipped list of ``mutants`` (a validated build of ``name``, whose files are in
    ``repo``, under ``key``, ``seed`` and ``limits``, a
    :class:`~vt_envs.domains.swe.sources.BuildLimits`): deterministic JSON text, one task
    a line."""
    table: dict[str, int] = {}
    for mutant in mutants:
        for test_id in mutant.pass_to_pass:
            table.setdefault(test_id, len(table))
    tasks, sources = [], {}
    for mutant in mutants:
        mutation = dataclasses.asdict(mutant.mutation)
        path, mutated = mutation["path"], mutation.pop("mutant_source")
        if path not in sources:
            sources[path] = (repo / path).read_text()
        tasks.append({
            "mutation": mutation,
            "edit": [*_span(sources[path], mutated), _sha(mutated)],
            "fail_to_pass": list(mutant.fail_to_pass),
            "pass_to_pass": _runs([table[t] for t in mutant.pass_to_pass]),
            "test_files": list(mutant.test_files),
            "issue_text": mutant.issue_text,
        })  # fmt: skip
    header = {
        "format": FORMAT_VERSION, "name": name, "version": version, "key": key,
        "seed": seed, "limits": dataclasses.asdict(limits),
    }  # fmt: skip
    lines = [json.dumps(header, sort_keys=True)[:-1] + ","]
    lines.append(' "tests": [')
    lines.append(",\n".join("  " + json.dumps(t) for t in table))
    lines.append(" ],")
    lines.append(' "tasks": [')
    lines.append(",\n".join("  " + json.dumps(t, sort_keys=True) for t in tasks))
    lines.append(" ]}")
    return "\n".join(lines) + "\n"


def loads(text: str, *, repo: Path, key: str, seed: int, limits: Any) -> list[MutantTask] | None:
    """The mutants of a shipped list, or ``None`` where it is not this build's (another
    key, seed, limits or format) or a mutant file it rebuilds from ``repo`` is not the
    validated one."""
    data = json.loads(text)
    wanted = {"format": FORMAT_VERSION, "key": key, "seed": seed,
              "limits": dataclasses.asdict(limits)}  # fmt: skip
    if any(data.get(field) != value for field, value in wanted.items()):
        return None
    tests, sources, mutants = data["tests"], {}, []
    for task in data["tasks"]:
        path = task["mutation"]["path"]
        if path not in sources:
            sources[path] = (repo / path).read_text()
        start, end, replacement, digest = task["edit"]
        mutated = sources[path][:start] + replacement + sources[path][end:]
        if _sha(mutated) != digest:
            _log.warning("%s: the mutant of %s is not rebuilt from %s", data["name"], path, repo)
            return None
        mutants.append(MutantTask(
            mutation=Mutation(**task["mutation"], mutant_source=mutated),
            fail_to_pass=tuple(task["fail_to_pass"]),
            pass_to_pass=tuple(tests[i] for s, n in task["pass_to_pass"] for i in range(s, s + n)),
            test_files=tuple(task["test_files"]),
            issue_text=task["issue_text"],
        ))  # fmt: skip
    return mutants


def find_shipped(name: str, *, repo: Path, key: str, seed: int,
                 limits: Any) -> list[MutantTask] | None:  # fmt: skip
    """The mutants of the shipped list of ``name`` that is this build's (see :func:`loads`),
    or ``None`` where there is none."""
    paths = [shipped_path(name), *sorted(SHIPPED_DIR.glob(f"validated-{name}-*.json"))]
    for path in (p for p in paths if p.is_file()):
        mutants = loads(path.read_text(), repo=repo, key=key, seed=seed, limits=limits)
        if mutants is not None:
            return mutants
    return None


def _span(source: str, mutated: str) -> tuple[int, int, str]:
    """The one span ``source[start:end]`` that ``mutated`` replaces, and its replacement."""
    limit = min(len(source), len(mutated))
    start = next((i for i in range(limit) if source[i] != mutated[i]), limit)
    end = 0  # the common suffix's length, not reaching into the common prefix
    while end < limit - start and source[-1 - end] == mutated[-1 - end]:
        end += 1
    return start, len(source) - end, mutated[start : len(mutated) - end]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _runs(indices: Sequence[int]) -> list[list[int]]:
    """``indices`` as ``[start, length]`` runs of consecutive numbers."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return runs
