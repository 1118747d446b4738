"""``vt_envs.domains.swe.fetch``: sdists downloaded with pip (from a local find-links
directory here: no index is reached) and unpacked without leaving their tree."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from vt_envs.domains.swe.fetch import fetch_sdist, unpack_sdist
from vt_envs.errors import DatasetFormatError

# A build backend in the sdist itself, so pip prepares its metadata with nothing installed.
BACKEND = """import os
def get_requires_for_build_wheel(config_settings=None):
    return []
def prepare_metadata_for_build_wheel(directory, config_settings=None):
    os.makedirs(os.path.join(directory, "mini_pkg-0.3.1.dist-info"))
    with open(os.path.join(directory, "mini_pkg-0.3.1.dist-info", "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: mini-pkg\\nVersion: 0.3.1\\n")
    return "mini_pkg-0.3.1.dist-info"
"""
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
META = "Metadata-Version: 2.1\nName: mini-pkg\nVersion: 0.3.1\n"


def _tar(path: Path, members: dict[str, str], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def _sdist(directory: Path) -> Path:
    top = "mini_pkg-0.3.1"
    return _tar(
        directory / f"{top}.tar.gz",
        {
            f"{top}/PKG-INFO": META,
            f"{top}/pyproject.toml": PYPROJECT,
            f"{top}/backend.py": BACKEND,
            f"{top}/mini_pkg/__init__.py": "def one():\n    return 1\n",
            f"{top}/tests/test_one.py": "from mini_pkg import one\n\ndef test_one():\n"
            "    assert one() == 1\n",
        },
    )


def test_pip_downloads_and_the_tree_is_unpacked(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    _sdist(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    tree = fetch_sdist("mini-pkg==0.3.1", tmp_path / "out")
    assert tree == tmp_path / "out" / "mini_pkg-0.3.1"
    assert (tree / "mini_pkg" / "__init__.py").is_file() and (tree / "tests").is_dir()


def test_the_command_line_prints_the_tree(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    _sdist(index)
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "vt_envs.domains.swe.fetch", "mini_pkg==0.3.1", "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == str(tmp_path / "out" / "mini_pkg-0.3.1")


@pytest.mark.parametrize(
    "members, links",
    [
        ({"pkg-1/a.py": "", "../escaped.py": "x"}, None),
        ({"pkg-1/a.py": "", "/tmp/absolute.py": "x"}, None),
        ({"pkg-1/a.py": ""}, {"pkg-1/out": "/etc/passwd"}),
        ({"pkg-1/a.py": ""}, {"pkg-1/up": "../../.."}),
        ({"pkg-1/a.py": "", "other-2/b.py": ""}, None),
    ],
    ids=["dot-dot", "absolute", "link-out", "link-up", "two-tops"],
)
def test_a_hostile_archive_is_refused_and_nothing_lands_outside(tmp_path, members, links):
    archive = _tar(tmp_path / "bad.tar.gz", members, links)
    out = tmp_path / "deep" / "out"
    out.mkdir(parents=True)
    with pytest.raises(DatasetFormatError):
        unpack_sdist(archive, out)
    assert not (tmp_path / "deep" / "escaped.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "deep"]
