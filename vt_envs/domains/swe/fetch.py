"""``python -m vt_envs.domains.swe.fetch REQUIREMENT... --out DIR``: a package's source
distribution, unpacked, ready for VT-SWE-v0's task builder.

pip downloads the sdist (``--no-binary :all: --no-deps``: the source release,
which ships the tests, from the package index pip is configured with); it is
unpacked with tarfile's ``data`` filter (no absolute paths, links out of the
tree or special files). Then build and use its tasks with::

    gym.make("VT-SWE-v0", repo="DIR/toolz-1.0.0", test_dir="toolz/tests")

Packages measured on this machine (their sdists' own tests, no extra test
dependencies): toolz, boltons, cachetools, parse, more-itertools.

``python -m vt_envs.domains.swe.fetch --defaults [--repos NAME...]`` fetches
VT-SWE-v0's pinned default repositories
(:data:`~vt_envs.domains.swe.default_repos.DEFAULT_REPOS`) into the task cache
and builds their tasks, once (``make test`` runs it at install). Their validated
mutants ship with VT (:mod:`~vt_envs.domains.swe.validated`), so this takes seconds
plus the downloads; ``--validate`` runs every candidate mutant's tests instead (about
12 minutes on two cores) and ``--write-shipped`` writes the result back as the shipped
lists (``--defaults --validate --write-shipped`` regenerates them).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from vt_envs.errors import DatasetFormatError

__all__ = ["fetch_defaults", "fetch_sdist", "main", "unpack_sdist"]


def fetch_sdist(requirement: str, out: Path, *, sha256: str | None = None) -> Path:
    """Download and unpack ``requirement``'s sdist into ``out``; returns the source tree.

    With ``sha256``, pip runs in hash-checking mode: an archive with another digest is
    refused before anything of it runs (pip builds an sdist's metadata to download it).

    Raises:
        subprocess.CalledProcessError: pip failed (its ``stderr`` says why: offline, no
            such version, a hash mismatch).
    """
    out.mkdir(parents=True, exist_ok=True)
    downloads = out / ".downloads"
    spec = [requirement]
    if sha256 is not None:
        pinned = out / ".requirement.txt"
        pinned.write_text(f"{requirement} --hash=sha256:{sha256}\n")
        spec = ["--require-hashes", "-r", str(pinned)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         "--quiet", "--dest", str(downloads), *spec],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    name = re.split(r"[=<>!~;\[ ]", requirement, maxsplit=1)[0].strip()
    archives = sorted(p for p in downloads.iterdir() if _normalized(p.name).startswith(
        _normalized(name) + "-"))  # fmt: skip
    if not archives:
        raise FileNotFoundError(f"pip downloaded no sdist of {requirement!r} into {downloads}")
    return unpack_sdist(archives[-1], out)


def unpack_sdist(archive: Path, out: Path) -> Path:
    """Unpack a ``.tar.gz`` / ``.zip`` sdist into ``out``; returns its top directory.

    Raises:
        DatasetFormatError: the archive is not one top directory, or a member would
            land outside it (absolute paths, ``..``, links out of the tree, devices).
    """
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            names = z.namelist()
            top = _single_top(archive, names)
            for member in names:
                if member.startswith("/") or ".." in Path(member).parts:
                    raise DatasetFormatError(f"{archive.name}: member {member!r} leaves the tree")
            z.extractall(out)
    else:
        with tarfile.open(archive) as t:
            top = _single_top(archive, t.getnames())
            try:
                t.extractall(out, filter="data")
            except tarfile.FilterError as exc:
                raise DatasetFormatError(f"{archive.name}: {exc}; not unpacked") from exc
    return out / top


def _single_top(archive: Path, names: list[str]) -> str:
    tops = {n.lstrip("./").split("/", 1)[0] for n in names if n.strip("./")}
    if len(tops) != 1:
        raise DatasetFormatError(
            f"{archive.name}: an sdist holds one top directory, this one holds {sorted(tops)}"
        )
    return tops.pop()


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def fetch_defaults(
    repos: list[str] | None = None,
    *,
    seed: int = 0,
    validate: bool = False,
    write_shipped: bool = False,
) -> list[str]:
    """Fetch VT-SWE-v0's default repositories (or ``repos`` of them) into the SWE task
    cache and build their tasks (both splits); returns one line per repository.

    Their mutants come from the cache, else from the shipped validated lists (seconds);
    ``validate``: the tests run on every candidate mutant (minutes), whatever is there.
    ``write_shipped``: then write each repository's shipped list (into VT's assets).
    """
    from vt_envs.domains.swe.default_repos import (
        BUILTIN,
        DEFAULT_REPOS,
        default_mutants,
        ensure_repo,
        resolve_repos,
    )
    from vt_envs.domains.swe.default_repos import write_shipped as write
    from vt_envs.domains.swe.env import default_tasks
    from vt_envs.domains.swe.tasks import swe_cache_dir

    lines = []
    for name in resolve_repos(repos):
        started = time.monotonic()
        if name != BUILTIN:
            ensure_repo(DEFAULT_REPOS[name], swe_cache_dir())
        fetched = time.monotonic()
        built = default_mutants(name, seed=seed, validate=validate)
        mutants = time.monotonic()
        counts = [len(default_tasks(split, [name], seed=seed)) for split in ("train", "test")]
        done = time.monotonic()
        lines.append(
            f"{name}: {counts[0]} train / {counts[1]} test tasks ({done - started:.1f} s: "
            f"fetch {fetched - started:.1f} s, mutants {mutants - fetched:.1f} s "
            f"[{built.origin}], task trees {done - mutants:.1f} s)"
        )
        if write_shipped:
            lines[-1] += f"; wrote {write(built)}"
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirements", nargs="*", help="e.g. toolz==1.0.0")
    parser.add_argument("--out", type=Path, help="where to unpack the requirements")
    parser.add_argument(
        "--defaults", action="store_true",
        help="fetch VT-SWE-v0's default repositories into the task cache and build their tasks",
    )  # fmt: skip
    parser.add_argument("--repos", nargs="+", help="with --defaults: only these of them")
    parser.add_argument(
        "--validate", action="store_true",
        help="with --defaults: run the tests on every candidate mutant (minutes) instead of "
        "reading the cached or shipped validated mutants",
    )  # fmt: skip
    parser.add_argument(
        "--write-shipped", action="store_true",
        help="with --defaults: write each repository's mutants as its shipped validated list "
        "(vt_envs/assets/swe/validated-*.json); regenerate them with --validate",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if (args.validate or args.write_shipped or args.repos) and not args.defaults:
        parser.error("--repos, --validate and --write-shipped go with --defaults")
    if args.defaults:
        fetch_defaults(args.repos, validate=args.validate, write_shipped=args.write_shipped)
    elif not args.requirements or args.out is None:
        parser.error("give REQUIREMENT... --out DIR, or --defaults")
    for requirement in args.requirements:
        print(fetch_sdist(requirement, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
