"""The README's ten-line example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_ten_line_example_runs():
    section = README.read_text().split("## Ten lines", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 12
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "1.0 True {'outcome': 1.0}" in out.stdout
