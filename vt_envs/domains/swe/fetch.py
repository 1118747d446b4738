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
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

__all__ = ["fetch_sdist", "main"]


def fetch_sdist(requirement: str, out: Path) -> Path:
    """Download and unpack ``requirement``'s sdist into ``out``; returns the source tree."""
    out.mkdir(parents=True, exist_ok=True)
    downloads = out / ".downloads"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         "--quiet", "--dest", str(downloads), requirement],
        check=True,
    )  # fmt: skip
    name = requirement.split("==")[0].split(">")[0].split("<")[0].strip().lower()
    archives = sorted(
        p for p in downloads.iterdir() if p.name.lower().replace("_", "-").startswith(name)
    )
    if not archives:
        raise FileNotFoundError(f"pip downloaded no sdist of {requirement!r} into {downloads}")
    archive = archives[-1]
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            top = z.namelist()[0].split("/")[0]
            z.extractall(out)
    else:
        with tarfile.open(archive) as t:
            top = t.getnames()[0].split("/")[0]
            t.extractall(out, filter="data")
    return out / top


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
