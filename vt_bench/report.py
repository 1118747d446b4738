"""``vt-bench speed`` (alias ``all``): run every benchmark, write ``OUT/REPORT.md``.

Each benchmark in :data:`PLAN` runs in its own process (``python -m vt_bench
NAME ARGS --out OUT``) with modest, explicit arguments, so the whole report
takes a few minutes on two cores and one benchmark's state (torch threads,
sandbox pools, verifier workers) cannot skew another's. Each writes its JSON
to ``OUT``; its Markdown is rendered back from that JSON by the module's own
``render``. ``REPORT.md`` has one section per benchmark: the table, the
command that reproduces it, and the machine. A benchmark that fails (or
times out) gets a section with the tail of its log; the others still run,
and the command exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PLAN", "Outcome", "add_arguments", "machine_facts", "main", "run_all"]

# (command, arguments): the modest defaults of `all`. Each line is also the
# reproduction command printed in the report (plus `--out OUT`).
PLAN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("env-speed", ("--episodes", "30", "--seconds", "20")),
    ("sandbox-speed", ("--repeats", "100", "--startups", "10")),
    ("sql-speed", ("--episodes", "30", "--repeats", "3", "--calls", "100")),
    (
        "math-speed",
        ("--episodes", "20", "--repeats", "3", "--calls", "200", "--verify-calls", "10"),
    ),
    ("search-speed", ("--sizes", "100000", "--repeats", "2")),
    ("visual-speed", ("--episodes", "16", "--repeats", "3")),
    ("swe-speed", ("--episodes", "10")),
    ("rollout-speed", ("--trajectories", "64")),
    ("rollout-scale", ("--concurrency", "256", "512", "1024")),
    ("generation-speed", ("--rounds", "5")),
    ("multiturn-speed", ("--episodes", "4", "--turns", "8")),
    ("sync-speed", ("--rounds", "3")),
    ("zero3-memory", ()),
    ("trainer-speed", ("--steps", "3")),
    ("server-speed", ("--steps", "200", "--calls", "2000")),
)

LOG_TAIL_LINES = 30


@dataclass
class Outcome:
    """One benchmark's run: its command, exit status, wall time and Markdown."""

    name: str
    argv: list[str]
    returncode: int
    wall_s: float
    markdown: str | None  # None when the run failed or wrote no JSON
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.markdown is not None


def machine_facts() -> dict[str, Any]:
    """CPU count, Python and torch versions, platform, date (UTC) and git commit."""
    try:
        torch_version = importlib.metadata.version("torch")  # without importing torch
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch_version,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or None,
    }


def _machine_line(m: dict[str, Any]) -> str:
    parts = [f"{m['cpus']} CPUs", f"Python {m['python']}"]
    if m["torch"]:
        parts.append(f"torch {m['torch']}")
    parts += [m["platform"], m["date"]]
    if m["commit"]:
        parts.append(f"commit {m['commit']}")
    return ", ".join(parts)


def _command(name: str, args: Sequence[str], out: Path) -> list[str]:
    return ["python", "-m", "vt_bench", name, *args, "--out", str(out)]


def _run_one(name: str, args: Sequence[str], out: Path, timeout_s: float) -> Outcome:
    from vt_bench.__main__ import COMMANDS

    module = COMMANDS[name][0]
    argv = _command(name, args, out)
    log = out / "logs" / f"{name}.log"
    json_path = out / f"{module.rsplit('.', 1)[-1]}.json"
    json_path.unlink(missing_ok=True)  # a stale JSON must not pass for this run's
    start = time.perf_counter()
    with log.open("w") as sink:
        try:
            returncode = subprocess.run(
                [sys.executable, *argv[1:]],
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            sink.write(f"\n[vt_bench all] timed out after {timeout_s:.0f} s\n")
            returncode = 124
    wall_s = time.perf_counter() - start
    markdown = None
    if returncode == 0 and json_path.exists():
        markdown = importlib.import_module(module).render(json.loads(json_path.read_text()))
    return Outcome(name, argv, returncode, wall_s, markdown, log)


def _section(outcome: Outcome, help_text: str, machine: str) -> str:
    lines = [
        f"## {outcome.name}",
        "",
        help_text,
        "",
        "```",
        shlex.join(outcome.argv),
        "```",
        "",
    ]
    if outcome.ok:
        assert outcome.markdown is not None
        lines += [outcome.markdown, ""]
    else:
        tail = outcome.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        lines += [
            f"**Failed** (exit code {outcome.returncode}); the last lines of `{outcome.log.name}`:",
            "",
            "```",
            *tail,
            "```",
            "",
        ]
    lines.append(f"Machine: {machine}; took {outcome.wall_s:.1f} s.")
    return "\n".join(lines)


def run_all(
    plan: Sequence[tuple[str, Sequence[str]]], out: Path, *, timeout_s: float = 1800.0
) -> tuple[list[Outcome], Path]:
    """Run each ``(command, args)`` of ``plan`` with ``--out out``; write
    ``out/REPORT.md``. Returns the outcomes and the report's path."""
    from vt_bench.__main__ import COMMANDS

    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    machine = machine_facts()
    machine_line = _machine_line(machine)
    outcomes = []
    for i, (name, args) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {shlex.join(_command(name, args, out))}", flush=True)
        outcome = _run_one(name, args, out, timeout_s)
        status = "ok" if outcome.ok else f"FAILED (exit {outcome.returncode}, see {outcome.log})"
        print(f"        {outcome.wall_s:.1f} s, {status}", flush=True)
        outcomes.append(outcome)
    sections = [_section(o, COMMANDS[o.name][1], machine_line) for o in outcomes]
    total = sum(o.wall_s for o in outcomes)
    report = "\n\n".join(
        [
            "# VT benchmarks",
            f"Machine: {machine_line}. All benchmarks took {total:.0f} s.\n\n"
            f"Reproduce: `python -m vt_bench speed --out {out}` (each section gives its own "
            f"command; its JSON is next to this file).",
            *sections,
        ]
    )
    path = out / "REPORT.md"
    path.write_text(report + "\n")
    return outcomes, path


DOC_BEGIN = (
    "<!-- vt-bench speed: begin (generated by `vt-bench speed --doc docs/benchmarks.md`) -->"
)
DOC_END = "<!-- vt-bench speed: end -->"


def doc_block(out: Path, machine_line: str) -> str:
    """The generated benchmark tables of ``docs/benchmarks.md``, rendered from ``out``'s
    JSONs: every env id with its oracle (``env-speed``), VT vs peers (``peers-speed``) and
    rollouts at scale (``rollout-scale``), each with its command."""
    from vt_bench import env_speed, peers_speed, rollout_scale

    parts = [DOC_BEGIN, ""]
    for module, name, args in (
        (env_speed, "env_speed.json", "env-speed"),
        (peers_speed, "peers_speed.json", "peers-speed --peers DIR"),
        (rollout_scale, "rollout_scale.json", "rollout-scale --concurrency 256 512 1024"),
    ):
        path = out / name
        if path.exists():
            parts += [module.render(json.loads(path.read_text())), "",
                      f"`python -m vt_bench {args}`; {machine_line}.", ""]  # fmt: skip
    parts.append(DOC_END)
    return "\n".join(parts)


def check_doc(doc: Path) -> None:
    """Fail (before any benchmark runs) unless ``doc`` holds the generated block's markers."""
    text = doc.read_text() if doc.is_file() else ""
    if DOC_BEGIN not in text or DOC_END not in text:
        raise SystemExit(f"{doc} has no '{DOC_BEGIN}' ... '{DOC_END}' markers")


def update_doc(doc: Path, block: str) -> None:
    """Replace the text between ``doc``'s markers with ``block``."""
    check_doc(doc)
    head, rest = doc.read_text().split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    doc.write_text(head + block + tail)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = [name for name, _ in PLAN]
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for REPORT.md and the JSONs"
    )
    parser.add_argument(
        "--only", nargs="+", choices=names, metavar="NAME", help=f"run a subset of: {names}"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=1800.0, help="per-benchmark wall-clock limit"
    )
    parser.add_argument(
        "--peers", type=Path, default=os.environ.get("VT_PEERS"),
        help="directory of peers' venvs: also run peers-speed (default $VT_PEERS)",
    )  # fmt: skip
    parser.add_argument(
        "--doc", type=Path, default=None, metavar="PATH",
        help="rewrite the generated tables between the markers of PATH (docs/benchmarks.md)",
    )  # fmt: skip
    # Deprecated: the tables moved from the README to docs/benchmarks.md.
    parser.add_argument("--readme", type=Path, default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.readme is not None:
        print("vt-bench speed: --readme is deprecated; use --doc", file=sys.stderr)
        args.doc = args.doc or args.readme
    if args.doc is not None:
        check_doc(args.doc)  # before the benchmarks run, not after
    plan = [(name, a) for name, a in PLAN if not args.only or name in args.only]
    if args.peers is not None:
        plan.append(("peers-speed", ("--peers", str(args.peers), "--rounds", "5")))
    outcomes, path = run_all(plan, args.out, timeout_s=args.timeout_s)
    print()
    print(path.read_text())
    print(f"Wrote {path}")
    if args.doc is not None:
        update_doc(args.doc, doc_block(args.out, _machine_line(machine_facts())))
        print(f"Updated the tables in {args.doc}")
    return 0 if all(o.ok for o in outcomes) else 1
