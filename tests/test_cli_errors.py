"""A user error on the command line is one line in words and exit status 2; ``--debug``
shows the traceback. Each console script is run as a user runs it, as a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "argv, said",
    [
        (("vt-bench", "eval", "VT-Nope-v0", "--policy", "oracle", "--out", "x"),
         "vt-bench: error: unknown env id 'VT-Nope-v0'"),
        (("vt-bench", "eval", "VT-Math-v0", "--policy", "shortcut:larges", "--out", "x"),
         "Did you mean 'largest'?"),
        (("vt-train", "check", str(ROOT / "configs" / "lookup_grpo_cpu.yaml"), "improts=[x]"),
         "vt-train: error: unknown config key 'improts'. Did you mean 'imports'?"),
        (("vt-train", "missing-recipe.yaml"),
         "vt-train: error: config file 'missing-recipe.yaml' does not exist"),
        (("vt-tool-server", "--insecure-no-token", "--env", "VT-Nope-v0"),
         "vt-tool-server: error: Unknown env id 'VT-Nope-v0'"),
        (("vt-tool-server", "--insecure-no-token", "--config", "missing.yaml"),
         "vt-tool-server: error: cannot read the server config 'missing.yaml'"),
    ],
)  # fmt: skip
def test_a_user_error_is_one_line_and_exit_2(argv, said, tmp_path):
    result = _run(*argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith(f"{argv[0]}: error: ") and said in lines[-1], lines


def test_debug_shows_the_traceback(tmp_path):
    result = _run("vt-bench", "eval", "VT-Nope-v0", "--policy", "oracle", "--out", "x",
                  "--debug", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "InvalidConfigError" in result.stderr
