"""``vt-bench eval ENV_ID... --policy P``: evaluate a policy; see :mod:`vt_bench.evals`.

Examples::

    vt-bench eval all --policy oracle --tasks 20 --out runs/eval-oracle
    vt-bench eval VT-Math-v0 VT-SQL-v0 --policy hf:runs/quickstart/sft/model \\
        --tasks 50 --samples 8 --temperature 1.0 --out runs/eval-tiny
    vt-bench eval VT-Lookup-v0 VT-Math-v0 --policy hf:smollm2-135m-instruct --tasks 4
    vt-bench eval VT-SQL-v0 --policy openai:http://127.0.0.1:8000/v1 --model tiny \\
        --api completions --tokenizer DIR --out runs/eval-served
    vt-bench eval --resume runs/eval-tiny      # after a crash: only what is missing

The endpoint's API key, if any, is read from ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vt_envs.errors import InvalidConfigError

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_ids", nargs="*", help="registered env ids, or 'all'")
    parser.add_argument(
        "--policy", help="oracle | no-tool | hf:DIR|NAME | vllm:DIR|NAME | openai:URL"
    )
    parser.add_argument("--model", default="", help="the served model's name (openai:URL)")
    parser.add_argument("--api", default="completions", choices=("completions", "chat"))
    parser.add_argument("--tokenizer", default=None, help="the env's tokenizer directory")
    parser.add_argument("--tasks", type=int, default=20, help="tasks per env id")
    parser.add_argument("--samples", type=int, default=1, help="rollouts per task (pass@k)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="test")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts in flight per env")
    parser.add_argument(
        "--env-kwargs", default="{}", help="JSON keywords for every env, e.g. '{\"max_turns\": 4}'"
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for the results")
    parser.add_argument("--resume", type=Path, default=None, help="finish the evaluation in DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _config(args: argparse.Namespace):
    from vt_bench.evals.runner import EvalConfig

    if args.resume is not None:
        saved = args.resume / "config.json"
        if not saved.is_file():
            raise InvalidConfigError(f"--resume {args.resume}: no config.json there to resume")
        return EvalConfig(**json.loads(saved.read_text())), args.resume
    if not args.env_ids or not args.policy or args.out is None:
        raise InvalidConfigError("give ENV_ID... (or 'all'), --policy and --out, or --resume DIR")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(f"--env-kwargs must be a JSON object: {exc}") from exc
    config = EvalConfig(
        env_ids=list(args.env_ids), policy=args.policy, model=args.model, api=args.api,
        tokenizer=args.tokenizer, tasks=args.tasks, samples=args.samples, seed=args.seed,
        split=args.split, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, max_context=args.max_context,
        concurrency=args.concurrency, env_kwargs=env_kwargs,
    )  # fmt: skip
    return config, args.out


def main(args: argparse.Namespace) -> int:
    from vt_bench.evals.report import render_markdown
    from vt_bench.evals.runner import run_eval

    config, out = _config(args)
    summary = run_eval(config, out, progress=not args.no_progress)
    print(render_markdown(summary))
    print(f"Report: {out / 'REPORT.md'}; every rollout: {out / 'rollouts.jsonl'}")
    return 0
