"""``python -m vt_envs.domains.swe.fetch REQUIREMENT... --out DIR``: a package's source
distribution, unpacked, ready for VT-SWE-v0's task builder.

pip downloads the sdist (``--no-binary :all: --no-deps``: the source release,
which ships the tests, from the package index pip is configured with); it is
unpacked with tarfile's ``data`` filter (no absolute paths, links out of the
tree or special files). Then build and use its tasks with::

    gym.make("VT-SWE-v0", repo="DIR/toolz-1.0.0", test_dir="toolz/tests")

Packages measured on this machine (their sdists' own tests, no extra test
dependencies): toolz, boltons, cachetools, parse, more-itertools.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from vt_envs.errors import DatasetFormatError

__all__ = ["fetch_sdist", "main", "unpack_sdist"]


def fetch_sdist(requirement: str, out: Path) -> Path:
    """Download and unpack ``requirement``'s sdist into ``out``; returns the source tree."""
    out.mkdir(parents=True, exist_ok=True)
    downloads = out / ".downloads"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         "--quiet", "--dest", str(downloads), requirement],
        check=True,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirements", nargs="+", help="e.g. toolz==1.0.0")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for requirement in args.requirements:
        print(fetch_sdist(requirement, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
