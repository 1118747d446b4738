"""``python -m vt_bench COMMAND``: a small dispatcher over benchmark modules.

Each command is a module exposing ``add_arguments(parser)`` and
``main(args) -> int``; add one by adding a line to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "sandbox-speed": (
        "vt_bench.sandbox_speed",
        "Sandbox latency: persistent worker vs fresh subprocess.",
    ),
    "rollout-speed": (
        "vt_bench.rollout_speed",
        "Rollout wall time: trajectory-level async vs synchronous batch, same work.",
    ),
    "sql-speed": (
        "vt_bench.sql_speed",
        "VT-SQL-v0 oracle steps/s, embedded DB build times and sizes, tool/verifier latency.",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vt_bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
