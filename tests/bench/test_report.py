"""``vt-bench speed`` (``all``): the report's structure and failure handling (tiny runs)."""

from __future__ import annotations

import json
from pathlib import Path

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

    # eval, view and export are not speed benchmarks; peers-speed joins the plan with --peers DIR.
    assert sorted(name for name, _ in PLAN) == sorted(
        set(COMMANDS) - {"all", "speed", "eval", "view", "export", "peers-speed"}
    )


def test_the_doc_tables_are_rewritten_between_their_markers(tmp_path):
    from vt_bench.report import DOC_BEGIN, DOC_END, doc_block, update_doc

    assert main(["env-speed", "--env-ids", "VT-Lookup-v0", "--episodes", "3", "--seconds", "1",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Title\n\n{DOC_BEGIN}\nold table\n{DOC_END}\n\nafter\n")
    update_doc(doc, doc_block(tmp_path, "a machine"))
    text = doc.read_text()
    assert "old table" not in text and "| VT-Lookup-v0 |" in text
    assert text.startswith("# Title") and text.endswith("after\n")
    assert "`python -m vt_bench env-speed`; a machine." in text


def test_the_generated_block_lives_in_docs_benchmarks_not_the_readme():
    from vt_bench.report import DOC_BEGIN, DOC_END

    root = Path(__file__).parents[2]
    benchmarks = (root / "docs" / "benchmarks.md").read_text()
    assert benchmarks.count(DOC_BEGIN) == 1 and benchmarks.count(DOC_END) == 1
    readme = (root / "README.md").read_text()
    assert DOC_END not in readme and "vt-bench speed: begin" not in readme


@pytest.mark.parametrize("flag", ["--doc", "--readme"])
def test_a_doc_without_markers_is_refused_before_any_benchmark_runs(tmp_path, capsys, flag):
    doc = tmp_path / "README.md"
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match=r"has no .* markers"):
        main(["speed", "--only", "sandbox-speed", "--out", str(tmp_path / "out"), flag, str(doc)])
    assert not (tmp_path / "out").exists()
    assert ("--readme is deprecated; use --doc" in capsys.readouterr().err) == (flag == "--readme")


def test_all_rejects_an_unknown_benchmark_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["all", "--only", "no-such-bench"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'no-such-bench'" in capsys.readouterr().err
