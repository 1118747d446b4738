"""``vt-bench eval ENV_ID... --policy P``: evaluate a policy; see :mod:`vt_bench.evals`.

Examples::

    vt-bench eval all --policy oracle --tasks 20 --out runs/eval-oracle
    vt-bench eval all --policy shortcut --tasks 200 --out runs/eval-shortcut
    vt-bench eval VT-Math-v0 VT-SQL-v0 --policy hf:runs/quickstart/sft/model \\
        --tasks 50 --samples 8 --temperature 1.0 --out runs/eval-tiny
    vt-bench eval VT-Lookup-v0 VT-Math-v0 --policy hf:smollm2-135m-instruct --tasks 4
    vt-bench eval VT-SQL-v0 --policy openai:http://127.0.0.1:8000/v1 --model tiny \\
        --api completions --tokenizer DIR --out runs/eval-served
    vt-bench eval VT-Math-v0 VT-SQL-v0 --policy oracle --env-kwargs '{"max_turns": 4}' \
        --env-kwargs VT-Math-v0='{"families": ["modpow"]}' --out runs/eval-kw
    vt-bench eval --resume runs/eval-tiny      # after a crash: only what is missing
    vt-bench eval MyOrg/Capitals-v0 --import my_envs --policy oracle --out runs/mine
    WANDB_MODE=offline vt-bench eval VT-Lookup-v0 --policy oracle --out runs/ev --log wandb
    vt-bench eval VT-Lookup-v0 --policy oracle --out runs/ev --log mlflow   # file:runs/ev/mlruns

The endpoint's API key, if any, is read from ``OPENAI_API_KEY``.

Exit status: 0 when every rollout ended; 1 when any raised instead (the
endpoint down, an engine or env crash): the message names how many and the
first error, those env ids get no metrics, and ``--resume DIR`` plays the
failed rollouts again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vt_envs.core.plugins import add_import_argument
from vt_envs.errors import InvalidConfigError

__all__ = ["add_arguments", "main", "parse_env_kwargs"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_ids", nargs="*", help="registered env ids, or 'all'")
    parser.add_argument(
        "--policy",
        help="oracle | no-tool | shortcut[:NAME] | hf:DIR|NAME | vllm:DIR|NAME | openai:URL",
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
        "--env-kwargs",
        action="append",
        default=[],
        metavar="[ID=]JSON",
        help="env keywords: a JSON object for every env ('{\"max_turns\": 4}'), or "
        'ID=JSON for one env id (VT-Math-v0=\'{"families": ["modpow"]}\'), over the '
        "plain ones; repeatable",
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for the results")
    parser.add_argument("--resume", type=Path, default=None, help="finish the evaluation in DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="TRACKER",
        help="also log the summary metrics, a table of rollouts and the config to an "
        "experiment tracker: wandb or mlflow (pip install 'vt-envs[tracking]'); repeatable",
    )
    parser.add_argument(
        "--log-project", default="vt-bench", help="the W&B project / MLflow experiment"
    )
    parser.add_argument(
        "--log-run-name", default=None, help="the tracker run (default: OUT's name)"
    )
    add_import_argument(parser, "env ids; recorded for --resume")


def parse_env_kwargs(values: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--env-kwargs`` values -> (keywords for every env, env id -> its own keywords).

    A value is a JSON object (every env) or ``ID=JSON`` (that env id; split at the first
    ``={``, so a mixture id's own ``=`` is kept). Later values update earlier ones.
    """
    every: dict[str, Any] = {}
    by_id: dict[str, dict[str, Any]] = {}
    for value in values:
        text = value.strip()
        env_id = ""
        if not text.startswith("{"):
            env_id, sep, rest = text.partition("={")
            if not sep or not env_id.strip():
                raise InvalidConfigError(
                    f"--env-kwargs {value!r}: expected a JSON object ('{{\"max_turns\": 4}}') "
                    "or ID=JSON (VT-Math-v0='{\"max_turns\": 4}')"
                )
            env_id, text = env_id.strip(), "{" + rest
        try:
            kwargs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidConfigError(f"--env-kwargs {value!r}: not a JSON object: {exc}") from exc
        if not isinstance(kwargs, dict):
            raise InvalidConfigError(f"--env-kwargs {value!r}: not a JSON object")
        if env_id:
            by_id.setdefault(env_id, {}).update(kwargs)
        else:
            every.update(kwargs)
    return every, by_id


def _config(args: argparse.Namespace):
    from vt_bench.evals.runner import EvalConfig

    if args.resume is not None:
        saved = args.resume / "config.json"
        if not saved.is_file():
            raise InvalidConfigError(f"--resume {args.resume}: no config.json there to resume")
        return EvalConfig(**json.loads(saved.read_text())), args.resume
    if not args.env_ids or not args.policy or args.out is None:
        raise InvalidConfigError("give ENV_ID... (or 'all'), --policy and --out, or --resume DIR")
    env_kwargs, env_kwargs_by_id = parse_env_kwargs(args.env_kwargs)
    config = EvalConfig(
        env_ids=list(args.env_ids), policy=args.policy, model=args.model, api=args.api,
        tokenizer=args.tokenizer, tasks=args.tasks, samples=args.samples, seed=args.seed,
        split=args.split, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, max_context=args.max_context,
        concurrency=args.concurrency, env_kwargs=env_kwargs, env_kwargs_by_id=env_kwargs_by_id,
        imports=args.imports,
    )  # fmt: skip
    return config, args.out


def main(args: argparse.Namespace) -> int:
    from vt_bench.evals.report import render_markdown
    from vt_bench.evals.runner import failures, run_eval
    from vt_bench.evals.tracking import check_eval_trackers, log_eval

    trackers = check_eval_trackers(args.log)  # before anything is played
    config, out = _config(args)
    summary = run_eval(config, out, progress=not args.no_progress)
    if trackers:
        log_eval(trackers, summary, out, project=args.log_project, run_name=args.log_run_name)
    print(render_markdown(summary))
    print(f"Report: {out / 'REPORT.md'}; every rollout: {out / 'rollouts.jsonl'}")
    failed, total, first = failures(summary)
    if failed:
        where = ", ".join(
            f"{e} {m['failed']} of {m['episodes']}"
            for e, m in summary["envs"].items()
            if m.get("status") == "failed"
        )
        print(
            f"vt-bench eval: {failed} of {total} rollouts failed ({where}), so those env ids "
            f"are not scored. First error: {first}\nFix the cause, then `vt-bench eval "
            f"--resume {out}` plays the failed rollouts again.",
            file=sys.stderr,
        )
        return 1
    return 0
