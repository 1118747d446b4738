"""``vt-bench speed`` (``all``): the report's structure and failure handling (tiny runs)."""

from __future__ import annotations

import json

import pytest

from vt_bench.__main__ import main
from vt_bench.report import PLAN, run_all

TINY_PLAN = [
    ("sandbox-speed", ["--repeats", "2", "--startups", "1"]),
    ("math-speed", ["--bogus-flag"]),  # fails: argparse rejects it (exit code 2)
]


def test_run_all_writes_a_section_per_benchmark_and_survives_a_failure(tmp_path, capsys):
    outcomes, path = run_all(TINY_PLAN, tmp_path)
    assert path == tmp_path / "REPORT.md"
    assert [(o.name, o.ok, o.returncode) for o in outcomes] == [
        ("sandbox-speed", True, 0),
        ("math-speed", False, 2),
    ]
    report = path.read_text()
    sections = report.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["sandbox-speed", "math-speed"]
    ok, failed = sections
    # The reproduction command, the benchmark's own table, and the machine.
    assert f"python -m vt_bench sandbox-speed --repeats 2 --startups 1 --out {tmp_path}" in ok
    assert "| persistent | 2 |" in ok
    assert "Machine: " in ok and "CPUs, Python " in ok
    assert "**Failed** (exit code 2)" in failed and "--bogus-flag" in failed
    assert json.loads((tmp_path / "sandbox_speed.json").read_text())["repeats"] == 2
    assert not (tmp_path / "math_speed.json").exists()
    assert "[2/2] python -m vt_bench math-speed" in capsys.readouterr().out


def test_plan_covers_every_benchmark_command():
    from vt_bench.__main__ import COMMANDS

    # eval is not a speed benchmark; peers-speed joins the plan with --peers DIR.
    assert sorted(name for name, _ in PLAN) == sorted(
        set(COMMANDS) - {"all", "speed", "eval", "peers-speed"}
    )


def test_the_readme_tables_are_rewritten_between_their_markers(tmp_path):
    from vt_bench.report import README_BEGIN, README_END, readme_block, update_readme

    assert main(["env-speed", "--env-ids", "VT-Lookup-v0", "--episodes", "3", "--seconds", "1",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{README_BEGIN}\nold table\n{README_END}\n\nafter\n")
    update_readme(readme, readme_block(tmp_path, "a machine"))
    text = readme.read_text()
    assert "old table" not in text and "| VT-Lookup-v0 |" in text
    assert text.startswith("# Title") and text.endswith("after\n")
    assert "`python -m vt_bench env-speed`; a machine." in text


def test_all_rejects_an_unknown_benchmark_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["all", "--only", "no-such-bench"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'no-such-bench'" in capsys.readouterr().err
