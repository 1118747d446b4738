"""The import layers of ``[tool.importlinter]`` in pyproject.toml hold: vt_bench ->
vt_train -> vt_envs, and inside vt_envs server -> registration -> domains -> tools
-> sandbox -> core -> errors, with no ignored imports (issue 32)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_layers_hold_with_no_exceptions():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
    # A contract with ignore_imports reports "KEPT (N ignored imports)".
    assert "ignored import" not in result.stdout, result.stdout[-2000:]
