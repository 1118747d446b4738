"""What a run leaves on disk: metrics (JSONL + TensorBoard, and the trackers of
:mod:`vt_train.trackers`), transcripts, plots.

Layout of a run directory::

    config.yaml          the resolved config
    metrics.jsonl        one JSON object per logged step
    tb/                  TensorBoard event files
    tables/              tables (sampled transcripts) as JSONL, by name and step
    wandb/, mlruns/      W&B and MLflow runs (``logging: [..., wandb, mlflow]``)
    transcripts/         decoded sample episodes (held-out evaluations)
    checkpoints/         DeepSpeed checkpoints (+ latest)
    final/               the final policy in Hugging Face layout
    reward_curve.png     training reward and held-out accuracy by step
    summary.json         before / after evaluation
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vt_train.trajectory import Trajectory

__all__ = [
    "MetricsLogger",
    "plot_reward_curve",
    "read_metrics",
    "transcript_rows",
    "write_transcripts",
]


class MetricsLogger:
    """Sends a run's metrics to its trackers (:mod:`vt_train.trackers`): by default
    ``metrics.jsonl`` and TensorBoard (when installed); ``trackers`` names others
    (``["jsonl", "wandb", "mlflow"]``). Does nothing on ranks other than 0
    (``enabled=False``)."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        enabled: bool = True,
        trackers: Sequence[str] | None = None,
        tracker_options: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        from vt_train.trackers import JsonlTracker, check_tracker_names, make_tracker

        self.enabled = enabled  # False on every rank but 0
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if trackers is None:
            trackers = ["jsonl", "tensorboard"] if tensorboard else ["jsonl"]
        names = check_tracker_names(trackers)
        self.trackers: list[Any] = []
        if enabled:
            for name in names:
                tracker = make_tracker(name, run_dir, **dict(tracker_options or {}))
                if tracker is not None:
                    self.trackers.append(tracker)
            if config is not None:
                for tracker in self.trackers:
                    tracker.log_config(config)
        self._jsonl = next((t for t in self.trackers if isinstance(t, JsonlTracker)), None)

    @classmethod
    def for_config(cls, config: Any, *, enabled: bool = True) -> MetricsLogger:
        """The logger of a :class:`~vt_train.config.TrainConfig`'s run: its ``logging``
        trackers with its ``tracker`` options, given the resolved config."""
        from vt_train.config import resolved_config_dict

        options = dataclasses.asdict(config.tracker)
        options["run_name"] = options["run_name"] or Path(config.output_dir).resolve().name
        return cls(
            config.output_dir,
            enabled=enabled,
            trackers=config.trackers(),
            tracker_options=options,
            config=resolved_config_dict(config) if enabled else None,
        )

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        if not self.enabled:
            return
        for tracker in self.trackers:
            tracker.log_scalars(step, metrics)

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]], *, step: int) -> None:
        """One table (``rows`` of column -> value) to every tracker."""
        if not self.enabled:
            return
        for tracker in self.trackers:
            tracker.log_table(step, name, rows)

    def log_transcripts(
        self, path: str | Path, trajectories: Sequence[Trajectory], tokenizer: Any, *, step: int
    ) -> None:
        """Decoded trajectories into ``path`` (:func:`write_transcripts`) and, as the
        table ``transcripts``, to every tracker."""
        write_transcripts(path, trajectories, tokenizer)
        self.log_table("transcripts", transcript_rows(trajectories, tokenizer), step=step)

    def truncate_after(self, step: int) -> None:
        """Drop records logged after ``step`` (a resumed run replays those steps)."""
        if self.enabled and self._jsonl is not None:
            self._jsonl.truncate_after(step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def transcript_rows(trajectories: Sequence[Trajectory], tokenizer: Any) -> list[dict[str, Any]]:
    """One row per trajectory (task, reward, turns, tool calls, the decoded tokens)."""
    return [
        {
            "task_id": t.task_id,
            "reward": float(t.reward),
            "turns": t.turns,
            "tool_calls": t.tool_calls,
            "transcript": tokenizer.decode(t.input_ids),
        }
        for t in trajectories
    ]


def write_transcripts(path: str | Path, trajectories: Sequence[Trajectory], tokenizer: Any) -> None:
    """Decode trajectories into a readable file (the exact token stream)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    for t in trajectories:
        parts.append(
            f"===== task {t.task_id} | reward {t.reward:g} | turns {t.turns} | "
            f"tool calls {t.tool_calls} =====\n{tokenizer.decode(t.input_ids)}\n"
        )
    path.write_text("\n".join(parts))


def plot_reward_curve(run_dir: str | Path, *, title: str = "", window: int = 5) -> Path:
    """Plot the training reward (raw and smoothed) and held-out accuracy by step
    (a mixture's run: each domain's held-out accuracy too)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    train = [(r["step"], r["rollout/mean_reward"]) for r in records if "rollout/mean_reward" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    tools = [
        (r["step"], r["rollout/tool_use_rate"]) for r in records if "rollout/tool_use_rate" in r
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps, rewards = zip(*train)
        ax.plot(steps, rewards, color="tab:blue", alpha=0.3, label="train reward (per step)")
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1])
            / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        ax.plot(steps, smooth, color="tab:blue", label=f"train reward ({window}-step mean)")
    if tools:
        ax.plot(*zip(*tools), color="tab:green", alpha=0.6, label="train tool-use rate")
    sampled = [(r["step"], r["eval_t1/accuracy"]) for r in records if "eval_t1/accuracy" in r]
    if evals:
        ax.plot(*zip(*evals), "o-", color="tab:red", label="held-out accuracy (greedy)")
    if sampled:
        ax.plot(*zip(*sampled), "s--", color="tab:orange", label="held-out accuracy (T=1)")
    for domain, points in _per_domain(records, "eval/", "/accuracy").items():
        ax.plot(*zip(*points), ".:", label=f"held-out accuracy, {domain} (greedy)")
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title or Path(run_dir).name)
    fig.tight_layout()
    out = Path(run_dir) / "reward_curve.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _per_domain(
    records: list[dict[str, Any]], prefix: str, suffix: str
) -> dict[str, list[tuple[int, float]]]:
    """``{domain: [(step, value)]}`` of the keys ``{prefix}{domain}{suffix}`` (one level)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith(prefix) and key.endswith(suffix):
                domain = key[len(prefix) : -len(suffix)]
                if domain and "/" not in domain:
                    series.setdefault(domain, []).append((record["step"], value))
    return series
