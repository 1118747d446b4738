"""The import layers of ``[tool.importlinter]`` in pyproject.toml hold: vt_bench ->
vt_train -> vt_envs, and inside vt_envs server -> registration -> domains -> tools
-> sandbox -> core -> errors (a listed few known exceptions aside)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_layers_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
