"""Experiment trackers (``logging: [jsonl, tensorboard, wandb, mlflow]``, ``vt-bench eval
--log``), for real and offline: W&B in ``WANDB_MODE=offline`` (its run file read back
with W&B's own protobuf records) and MLflow on a local file store (read back with
``MlflowClient``)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    """W&B offline and silent, its settings and caches in the test's directory; MLflow
    may use a file store; nothing from the caller's environment picks another store."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# ------------------------------------------------------------------ readers


def wandb_records(root: Path) -> list:
    """Every record of the one offline W&B run under ``root`` (its ``run-ID.wandb``
    file: W&B's LevelDB-log framing of ``wandb_internal_pb2.Record`` protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = root.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(root: Path) -> dict[int, dict]:
    """``{step: {key: value}}`` of the offline run's history rows."""
    rows: dict[int, dict] = {}
    for record in wandb_records(root):
        if record.WhichOneof("record_type") == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.setdefault(int(row["_step"]), {}).update(row)
    return rows


def wandb_config(root: Path) -> dict:
    config: dict = {}
    for record in wandb_records(root):
        kind = record.WhichOneof("record_type")
        updates = (
            record.run.config.update
            if kind == "run"
            else record.config.update
            if kind == "config"
            else []
        )
        for item in updates:
            config[item.key] = json.loads(item.value_json)
    return config


def wandb_table(root: Path, history_row: dict, name: str) -> dict:
    (files,) = root.glob("wandb/offline-run-*/files")
    assert history_row[f"{name}/_type"] == "table-file"
    return json.loads((files / history_row[f"{name}/path"]).read_text())


def mlflow_run(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def mlflow_history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def mlflow_artifact(client, run_id: str, path: str, tmp_path: Path) -> str:
    local = client.download_artifacts(run_id, path, str(tmp_path / "downloads"))
    return Path(local).read_text()


# ------------------------------------------------------------------- trackers

STEPS = {
    0: {"eval/accuracy": 0.25, "eval/VT-Math-v0/accuracy": 0.5},
    1: {"rollout/mean_reward": 0.125, "rollout/VT-Math-v0/mean_reward": 0.0, "step": 1},
    2: {"rollout/mean_reward": 0.75, "note": "not a number", "nan": float("nan")},
}
ROWS = [
    {"task_id": "lookup/test/1", "reward": 1.0, "transcript": "<answer>042</answer>"},
    {"task_id": "lookup/test/2", "reward": 0.0, "transcript": "<answer>7</answer>"},
]
CONFIG = {"algo": "grpo", "rollout": {"n": 4, "temperature": 1.0}, "logging": ["jsonl"]}


def _log_everything(tracker) -> None:
    tracker.log_config(CONFIG)
    for step, metrics in STEPS.items():
        tracker.log_scalars(step, metrics)
    tracker.log_table(2, "transcripts", ROWS)
    tracker.finish()


def test_wandb_offline_run_holds_the_scalars_table_and_config(tmp_path):
    from vt_train.trackers import WandbTracker

    _log_everything(WandbTracker(tmp_path, project="vt-test", run_name="unit", tags=["t"]))
    history = wandb_history(tmp_path)
    assert sorted(history) == [0, 1, 2]
    assert history[0]["eval/accuracy"] == 0.25 and history[0]["eval/VT-Math-v0/accuracy"] == 0.5
    assert history[1]["rollout/mean_reward"] == 0.125
    assert history[1]["rollout/VT-Math-v0/mean_reward"] == 0.0
    assert history[2]["rollout/mean_reward"] == 0.75
    assert "note" not in history[2] and "nan" not in history[2] and "step" not in history[1]
    table = wandb_table(tmp_path, history[2], "transcripts")
    assert table["columns"] == ["task_id", "reward", "transcript"]
    assert table["data"] == [list(row.values()) for row in ROWS]
    config = wandb_config(tmp_path)
    assert config["algo"] == "grpo" and config["rollout"] == {"n": 4, "temperature": 1.0}


def test_mlflow_file_store_metric_history_equals_what_was_logged(tmp_path):
    from vt_train.trackers import MlflowTracker

    uri = (tmp_path / "store").as_uri()
    _log_everything(MlflowTracker(tmp_path, project="vt-test", tracking_uri=uri, tags=["t"]))
    client, run = mlflow_run(uri, "vt-test")
    rid = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert mlflow_history(client, rid, "rollout/mean_reward") == [(1, 0.125), (2, 0.75)]
    assert mlflow_history(client, rid, "eval/VT-Math-v0/accuracy") == [(0, 0.5)]
    assert mlflow_history(client, rid, "rollout/VT-Math-v0/mean_reward") == [(1, 0.0)]
    assert set(run.data.metrics) == {
        "eval/accuracy",
        "eval/VT-Math-v0/accuracy",
        "rollout/mean_reward",
        "rollout/VT-Math-v0/mean_reward",
    }
    table = json.loads(mlflow_artifact(client, rid, "transcripts/step000002.json", tmp_path))
    assert table == {"columns": list(ROWS[0]), "data": [list(r.values()) for r in ROWS]}
    assert yaml.safe_load(mlflow_artifact(client, rid, "config.yaml", tmp_path)) == CONFIG
    assert run.data.params["rollout.n"] == "4" and run.data.params["algo"] == '"grpo"'


def test_jsonl_and_an_unknown_or_missing_tracker(tmp_path, monkeypatch):
    from vt_envs.errors import InvalidConfigError, UnknownNameError
    from vt_train.config import load_config
    from vt_train.trackers import TrackerUnavailableError, make_tracker

    _log_everything(make_tracker("jsonl", tmp_path))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2] and lines[1]["rollout/mean_reward"] == 0.125
    rows = (tmp_path / "tables" / "transcripts" / "step000002.jsonl").read_text().splitlines()
    assert [json.loads(r) for r in rows] == ROWS

    with pytest.raises(UnknownNameError, match="Did you mean 'mlflow'"):
        load_config(None, ["logging=[jsonl, mlfow]"])
    with pytest.raises(InvalidConfigError, match="must list 'jsonl'"):
        load_config(None, ["logging=[wandb]"])
    # older recipes: tensorboard=false still turns TensorBoard off
    assert load_config(None, ["tensorboard=false"]).trackers() == ["jsonl"]
    assert load_config(None, []).trackers() == ["jsonl", "tensorboard"]

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(TrackerUnavailableError, match=r"pip install 'vt-envs\[tracking\]'"):
        make_tracker("wandb", tmp_path)


# ---------------------------------------------------------- the public commands


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


TINY_RUN = [
    "env.id=VT-Lookup-v0",
    "env.eval_episodes=2",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
    "intermediate_size: 64}",
    "rollout.engine=hf",
    "rollout.tasks_per_step=2",
    "rollout.n=2",
    "rollout.max_new_tokens=8",
    "rollout.max_context=512",
    "rollout.sync_check=false",
    "optim.minibatch_size=4",
    "optim.micro_batch_size=4",
    "deepspeed={zero_stage: 0, bf16: false, torch_adam: true}",
    "steps=1",
]


def test_vt_train_logs_to_mlflow_and_wandb(tmp_path):
    run_dir = tmp_path / "run"
    args = [_bin("vt-train"), *TINY_RUN, f"output_dir={run_dir}",
            "logging=[jsonl, mlflow, wandb]", "tracker.project=vt-test",
            "tracker.tags=[smoke]"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    jsonl: dict[int, dict] = {}  # a step's records (training, then evaluation) merged
    for record in map(json.loads, (run_dir / "metrics.jsonl").open()):
        jsonl.setdefault(record["step"], {}).update(record)

    client, run = mlflow_run((run_dir / "mlruns").as_uri(), "vt-test")
    rid = run.info.run_id
    assert run.info.run_name == "run" and "smoke" in run.data.tags
    reward = [(s, r["rollout/mean_reward"]) for s, r in jsonl.items() if "rollout/mean_reward" in r]
    assert [s for s, _ in reward] == [1]
    assert mlflow_history(client, rid, "rollout/mean_reward") == reward
    assert mlflow_history(client, rid, "time/update_s") == [(1, jsonl[1]["time/update_s"])]
    accuracy = mlflow_history(client, rid, "eval/accuracy")  # before and after
    assert accuracy == [(0, jsonl[0]["eval/accuracy"]), (1, jsonl[1]["eval/accuracy"])]
    for step in (0, 1):  # the sampled transcripts of both evaluations
        table = json.loads(
            mlflow_artifact(client, rid, f"transcripts/step{step:06d}.json", tmp_path)
        )
        assert table["columns"] == ["task_id", "reward", "turns", "tool_calls", "transcript"]
        assert len(table["data"]) == 2 and "<|im_start|>" in table["data"][0][-1]
    config = yaml.safe_load(mlflow_artifact(client, rid, "config.yaml", tmp_path))
    assert config == yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algorithm"]["clip_high"] == 0.2  # resolved

    history = wandb_history(run_dir)
    assert [(1, history[1]["rollout/mean_reward"])] == reward
    assert [history[s]["eval/accuracy"] for s in (0, 1)] == [a for _, a in accuracy]
    assert history[1]["time/update_s"] == jsonl[1]["time/update_s"]
    assert len(wandb_table(run_dir, history[1], "transcripts")["data"]) == 2
    assert wandb_config(run_dir)["algorithm"]["clip_high"] == 0.2


def test_vt_bench_eval_log_mlflow(tmp_path):
    from vt_bench.__main__ import main as vt_bench

    out = tmp_path / "ev"
    argv = ["eval", "VT-Lookup-v0", "--policy", "oracle", "--tasks", "2", "--samples", "2",
            "--out", str(out), "--no-progress", "--log", "mlflow",
            "--log-project", "vt-test"]  # fmt: skip
    assert vt_bench(argv) == 0
    summary = json.loads((out / "summary.json").read_text())["envs"]["VT-Lookup-v0"]
    client, run = mlflow_run((out / "mlruns").as_uri(), "vt-test")
    rid = run.info.run_id
    assert mlflow_history(client, rid, "VT-Lookup-v0/accuracy") == [(0, summary["accuracy"])]
    assert mlflow_history(client, rid, "VT-Lookup-v0/mean_reward") == [(0, 1.0)]
    assert mlflow_history(client, rid, "VT-Lookup-v0/pass_at_2") == [(0, 1.0)]
    assert run.data.metrics["VT-Lookup-v0/episodes"] == 4
    table = json.loads(mlflow_artifact(client, rid, "rollouts/step000000.json", tmp_path))
    assert len(table["data"]) == 4 and table["columns"][:2] == ["env_id", "task_id"]
    config = yaml.safe_load(mlflow_artifact(client, rid, "config.yaml", tmp_path))
    assert config["policy"] == "oracle" and config["tasks"] == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["vt-train", "configs/lookup_grpo_cpu.yaml", "logging=[jsonl, wandbb]"],
        ["vt-bench", "eval", "VT-Lookup-v0", "--policy", "oracle", "--out", "x", "--log", "mlfow"],
    ],
)
def test_an_unknown_tracker_is_a_one_line_error(argv, capsys, tmp_path, monkeypatch):
    from vt_bench.__main__ import console as vt_bench
    from vt_train.cli import console as vt_train

    monkeypatch.chdir(Path(__file__).parents[2])
    with pytest.raises(SystemExit) as exit_:
        (vt_train if argv[0] == "vt-train" else vt_bench)(argv[1:])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"{argv[0]}: error: Unknown tracker")
    assert "Did you mean 'wandb'?" in err or "Did you mean 'mlflow'?" in err


def test_a_dry_run_logs_to_no_tracker(tmp_path):
    from vt_train.config import load_config
    from vt_train.dry_run import dry_run_config

    recipe = Path(__file__).parents[2] / "configs" / "sql_grpo_qwen2.5-7b.yaml"
    recipe = load_config(recipe, ["logging=[jsonl, wandb, mlflow]"])
    assert recipe.trackers() == ["jsonl", "wandb", "mlflow"]
    assert dry_run_config(recipe, tmp_path, engine="hf").trackers() == ["jsonl"]
