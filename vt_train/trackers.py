"""Experiment trackers: where a run's scalars, tables and config go.

A trainer recipe lists them (``logging: [jsonl, tensorboard, wandb, mlflow]``, see
:class:`vt_train.config.TrackerConfig` for their options); ``vt-bench eval --log
wandb`` uses the same classes. Every tracker implements :class:`Tracker`:

- ``log_scalars(step, metrics)``: numbers by name (``rollout/mean_reward``,
  ``eval/VT-Math-v0/accuracy``: per-domain metrics are names like any other);
  the reward curve is ``rollout/mean_reward`` over the steps.
- ``log_table(step, name, rows)``: rows of one table (sampled transcripts).
- ``log_config(config)``: the run's resolved config.
- ``finish()``: flush and close.

Only rank 0 builds trackers. ``wandb`` and ``mlflow`` are imported when a tracker
is built, not before; without them the error names the extra to install
(``pip install 'vt-envs[tracking]'``). Runs go to the run directory unless told
otherwise: W&B under ``RUN/wandb/`` (``WANDB_MODE=offline`` writes there only, for
a later ``wandb sync``), MLflow to a local file store ``file:RUN/mlruns`` unless
``mlflow_tracking_uri`` (or ``MLFLOW_TRACKING_URI``) names another.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from vt_envs.errors import UnknownNameError, VTError

__all__ = [
    "TRACKERS",
    "JsonlTracker",
    "MlflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "TrackerUnavailableError",
    "WandbTracker",
    "check_tracker_names",
    "make_tracker",
    "scalars",
]

#: Every tracker name ``logging:`` and ``--log`` accept.
TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")


class TrackerUnavailableError(VTError, ImportError):
    """Raised when a tracker is asked for but its package cannot be imported."""


@runtime_checkable
class Tracker(Protocol):
    """Where a run's metrics go (see the module docstring)."""

    name: str

    def log_scalars(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def finish(self) -> None: ...


def check_tracker_names(names: Sequence[str], *, where: str = "logging") -> list[str]:
    """``names`` as a list, or an :class:`~vt_envs.errors.UnknownNameError` (with a
    "did you mean") for the first unknown one."""
    if isinstance(names, str):
        names = [names]
    for name in names:
        if name not in TRACKERS:
            raise UnknownNameError(
                "tracker",
                str(name),
                TRACKERS,
                hint=f"Set {where} to a list of them, e.g. {where}: [jsonl, wandb].",
            )
    return list(dict.fromkeys(names))  # in order, once each


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (bools as 0/1), without ``step``."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, default=str)


def _import(module: str, tracker: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrackerUnavailableError(
            f"the {tracker!r} tracker needs the {module} package, which failed to import "
            f"({exc}). Install the tracking extra: pip install 'vt-envs[tracking]' (or pip install "
            f"{'mlflow-skinny' if tracker == 'mlflow' else tracker}), or remove {tracker!r} "
            "from logging / --log"
        ) from exc


# ------------------------------------------------------------------ trackers


class JsonlTracker:
    """``metrics.jsonl`` (one object per logged step) and ``tables/NAME/stepNNNNNN.jsonl``
    in the run directory. The config is ``config.yaml``, written by the trainer."""

    name = "jsonl"

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log_scalars(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: v for k, v in metrics.items() if k != "step"}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        path = self.run_dir / "tables" / name / f"step{step:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(dict(row), default=str) + "\n" for row in rows))

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass  # the trainer writes config.yaml; vt-bench eval writes config.json

    def truncate_after(self, step: int) -> None:
        """Drop records logged after ``step`` (a resumed run replays those steps)."""
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
        self.path.write_text("".join(f"{line}\n" for line in kept))

    def finish(self) -> None:
        pass


class TensorBoardTracker:
    """Event files in ``RUN/tb``: scalars, tables and the config as text (Markdown)."""

    name = "tensorboard"

    def __init__(self, run_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter  # ImportError: the caller decides

        self.writer = SummaryWriter(str(Path(run_dir) / "tb"))

    def log_scalars(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = _columns(rows)
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in rows:
            cells = [str(_cell(row.get(c, ""))).replace("|", "\\|") for c in columns]
            lines.append("| " + " | ".join(c.replace("\n", "<br>") for c in cells) + " |")
        self.writer.add_text(name, "\n".join(lines), step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        text = yaml.safe_dump(dict(config), sort_keys=False)
        self.writer.add_text("config", "```\n" + text + "```", 0)

    def finish(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run (``wandb.init``) whose files go under ``RUN/wandb``.
    ``WANDB_MODE=offline`` keeps it on disk (``wandb sync`` uploads it later)."""

    name = "wandb"

    def __init__(
        self,
        run_dir: str | Path,
        *,
        project: str = "vt",
        run_name: str | None = None,
        tags: Sequence[str] = (),
        entity: str | None = None,
        mode: str | None = None,
    ):
        wandb = _import("wandb", "wandb")
        self._wandb = wandb
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=run_name or Path(run_dir).resolve().name,
            tags=list(tags) or None,
            dir=str(run_dir),
            mode=mode,
            reinit="create_new",
        )

    def log_scalars(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = _columns(rows)
        data = [[_cell(row.get(c)) for c in columns] for row in rows]
        self.run.log({name: self._wandb.Table(columns=columns, data=data)}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def finish(self) -> None:
        self.run.finish()


_MLFLOW_NAME = re.compile(r"[^A-Za-z0-9_\-. /]")


class MlflowTracker:
    """An MLflow run in experiment ``project``: scalars as metrics (one history per
    name), tables as JSON artifacts ``NAME/stepNNNNNN.json`` (MLflow's table format),
    the config as ``config.yaml`` and as flattened params.

    ``tracking_uri``: default ``MLFLOW_TRACKING_URI``, else a local file store
    ``file:RUN/mlruns`` (MLflow 3 refuses file stores unless
    ``MLFLOW_ALLOW_FILE_STORE=true``; for a ``file:`` URI this tracker sets it
    unless it is already set).
    """

    name = "mlflow"

    def __init__(
        self,
        run_dir: str | Path,
        *,
        project: str = "vt",
        run_name: str | None = None,
        tags: Sequence[str] = (),
        tracking_uri: str | None = None,
    ):
        _import("mlflow", "mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self._param = Metric, Param
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(run_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(project)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=run_name or Path(run_dir).resolve().name,
            tags={tag: "" for tag in tags},
        )
        self.run_id = run.info.run_id

    @staticmethod
    def metric_name(key: str) -> str:
        """``key`` with the characters MLflow refuses in a metric name replaced by ``_``."""
        return _MLFLOW_NAME.sub("_", key)

    def log_scalars(self, step: int, metrics: Mapping[str, Any]) -> None:
        now = int(time.time() * 1000)
        batch = [
            self._metric(self.metric_name(k), v, now, step) for k, v in scalars(metrics).items()
        ]
        for start in range(0, len(batch), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = _columns(rows)
        table = {"columns": columns, "data": [[_cell(r.get(c)) for c in columns] for r in rows]}
        self.client.log_dict(self.run_id, table, f"{self.metric_name(name)}/step{step:06d}.json")

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        self.client.log_text(
            self.run_id, yaml.safe_dump(dict(config), sort_keys=False), "config.yaml"
        )
        params = [
            self._param(self.metric_name(k)[:250], json.dumps(v, default=str)[:6000])
            for k, v in _flatten(config).items()
        ]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def make_tracker(
    name: str,
    run_dir: str | Path,
    *,
    project: str = "vt",
    run_name: str | None = None,
    tags: Sequence[str] = (),
    mlflow_tracking_uri: str | None = None,
    wandb_entity: str | None = None,
) -> Tracker | None:
    """The tracker ``name`` for ``run_dir``; ``None`` for ``tensorboard`` when the
    ``tensorboard`` package is missing (it is optional, as it always was)."""
    check_tracker_names([name])
    if name == "jsonl":
        return JsonlTracker(run_dir)
    if name == "tensorboard":
        try:
            return TensorBoardTracker(run_dir)
        except ImportError:
            return None
    if name == "wandb":
        return WandbTracker(
            run_dir, project=project, run_name=run_name, tags=tags, entity=wandb_entity
        )
    return MlflowTracker(
        run_dir, project=project, run_name=run_name, tags=tags, tracking_uri=mlflow_tracking_uri
    )
