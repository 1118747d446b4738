"""``vt-bench eval --log wandb|mlflow``: an evaluation's summary to experiment trackers
(:mod:`vt_train.trackers`).

Each tracker gets one run (named after ``--out``, in project ``--log-project``):
every env id's summary metrics as scalars at step 0 (``VT-Math-v0/accuracy``,
``VT-Math-v0/mean_reward``, ``VT-Math-v0/pass_at_1``, ..., a mixture's domains as
``ID/DOMAIN/accuracy``), a table ``rollouts`` of the first rollouts of every env id
(transcripts included), and the eval config. MLflow's default store is
``file:OUT/mlruns`` (or ``MLFLOW_TRACKING_URI``); W&B writes under ``OUT/wandb``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vt_envs.errors import UnknownNameError

__all__ = ["EVAL_TRACKERS", "check_eval_trackers", "eval_rows", "eval_scalars", "log_eval"]

#: The trackers ``--log`` accepts (the run directory already holds the JSON ones).
EVAL_TRACKERS = ("wandb", "mlflow")


def check_eval_trackers(names: Sequence[str]) -> list[str]:
    for name in names:
        if name not in EVAL_TRACKERS:
            raise UnknownNameError(
                "tracker", name, EVAL_TRACKERS, hint="Use --log wandb and/or --log mlflow."
            )
    return list(dict.fromkeys(names))


def eval_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """Every env id's numeric summary metrics, ``ID/NAME``."""
    out: dict[str, float] = {}
    for env_id, metrics in summary["envs"].items():
        _scalars(out, env_id, metrics)
    return out


def _scalars(out: dict[str, float], prefix: str, metrics: Mapping[str, Any]) -> None:
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}/{key}"] = float(value)
        elif key == "pass_at_k":
            for k, v in value.items():
                out[f"{prefix}/pass_at_{k}"] = float(v)
        elif key == "timing":
            for k, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"{prefix}/timing/{k}"] = float(v)
        elif key == "domains":
            for domain, domain_metrics in value.items():
                _scalars(out, f"{prefix}/{domain}", domain_metrics)


def eval_rows(records: Sequence[Mapping[str, Any]], per_env: int = 8) -> list[dict[str, Any]]:
    """The first ``per_env`` rollouts of every env id as table rows."""
    rows: list[dict[str, Any]] = []
    taken: dict[str, int] = {}
    ordered = sorted(records, key=lambda r: (r["env_id"], r.get("rollout_index", 0), r["sample"]))
    for r in ordered:
        if taken.get(r["env_id"], 0) >= per_env:
            continue
        taken[r["env_id"]] = taken.get(r["env_id"], 0) + 1
        rows.append(
            {
                "env_id": r["env_id"],
                "task_id": r["task_id"],
                "sample": r["sample"],
                "reward": r.get("reward"),
                "correct": r.get("correct"),
                "turns": len(r.get("turns") or []),
                "tool_calls": len(r.get("tool_calls") or []),
                "error": r.get("error"),
                "transcript": r.get("transcript", ""),
            }
        )
    return rows


def log_eval(
    names: Sequence[str],
    summary: Mapping[str, Any],
    out: str | Path,
    *,
    project: str = "vt-bench",
    run_name: str | None = None,
    rows_per_env: int = 8,
) -> None:
    """Send ``summary`` (and the rollouts in ``out/rollouts.jsonl``) to ``names``."""
    from vt_bench.evals.records import RecordFile
    from vt_train.trackers import make_tracker

    out = Path(out)
    rows = eval_rows(RecordFile(out / "rollouts.jsonl").read(), rows_per_env)
    scalars = eval_scalars(summary)
    config = {"policy": summary.get("policy"), **dict(summary.get("config") or {})}
    for name in check_eval_trackers(names):
        tracker = make_tracker(name, out, project=project, run_name=run_name or out.resolve().name)
        assert tracker is not None  # only tensorboard may be missing quietly
        try:
            tracker.log_config(config)
            tracker.log_scalars(0, scalars)
            tracker.log_table(0, "rollouts", rows)
        finally:
            tracker.finish()
