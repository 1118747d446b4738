"""The docs: the README stays a front door, every relative link resolves, and each
guide in docs/guides/ runs as written (its Python blocks, in order, as one script)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def python_blocks(text: str) -> str:
    """The page's ```python blocks, concatenated in order."""
    return "\n\n".join(re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 400


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.S | re.M)
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_there_are_guides_and_each_has_code():
    names = {g.name for g in GUIDES}
    assert {"add-an-env.md", "add-a-tool.md", "add-an-algorithm.md"} <= names
    for guide in GUIDES:
        assert python_blocks(guide.read_text()).strip(), f"{guide.name} has no ```python block"


@pytest.mark.parametrize("guide", GUIDES, ids=[g.stem for g in GUIDES])
def test_guide_runs_as_written(guide, tmp_path):
    script = tmp_path / f"{guide.stem}.py"
    script.write_text(python_blocks(guide.read_text()))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{guide.name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
