"""Eval records as a Hugging Face dataset (vt_train.integrations.datasets_export and
``vt-bench export``) that TRL's SFTTrainer trains on (CPU, tiny model)."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("trl")

import datasets
from train_helpers import saved_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from vt_bench.__main__ import main as bench_main
from vt_envs.core.tokenizer import load_tokenizer
from vt_train.integrations.datasets_export import read_records, records_to_dataset

DOCS = Path(__file__).resolve().parents[2] / "docs" / "eval"
LOOKUP = "VT-Lookup-v0"


def test_oracle_lookup_records_export_and_sftrainer_trains_on_them(tmp_path):
    # The CLI writes the dataset; it loads back with datasets.load_from_disk.
    out = tmp_path / "dataset"
    assert bench_main(["export", str(DOCS / "oracle"), "--env", LOOKUP, "--out", str(out)]) == 0
    ds = datasets.load_from_disk(str(out))
    records = [r for r in read_records(DOCS / "oracle") if r["env_id"] == LOOKUP]
    assert len(ds) == len(records) > 0
    assert set(ds["env_id"]) == {LOOKUP} and all(ds["replay_ok"])

    tok = load_tokenizer()  # the oracle eval's envs used the default tokenizer
    by_task = {r["task_id"]: r for r in records}
    for row in ds:
        record = by_task[row["task_id"]]
        assert row["reward"] == record["reward"] and row["ids_source"] == "env"
        # The ids are the episode's: they decode to the record's transcript, and the
        # assistant mask covers exactly each action's ids.
        assert tok.decode(row["input_ids"]) == record["transcript"]
        assert len(row["assistant_masks"]) == len(row["input_ids"])
        assert sum(row["assistant_masks"]) == sum(t["tokens_out"] for t in record["turns"])
        # Messages: the env's prompt, then each action and observation, tool calls parsed.
        messages = row["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        tail = messages[-4:]
        assert [m["role"] for m in tail] == ["user", "assistant", "tool", "assistant"]
        assert [m["content"] for m in tail[1::2]] == [t["action"] for t in record["turns"]]
        (call,) = tail[1]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "lookup"
        assert json.loads(call["function"]["arguments"]) == {"key": record["task"]["key"]}
        assert tail[2]["name"] == "lookup" and tail[3]["tool_calls"] is None

    # TRL's SFTTrainer reads it: one step on the tiny model, on the exported ids, the loss
    # on the assistant ids only.
    path = saved_tiny_model(tmp_path / "model")
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        args=SFTConfig(
            output_dir=str(tmp_path / "sft"),
            use_cpu=True,
            bf16=False,
            max_steps=1,
            per_device_train_batch_size=2,
            shuffle_dataset=False,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
        ),
        train_dataset=ds,
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    batches = []
    compute_loss = trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        batches.append({k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(trainer.state.log_history[0]["loss"])
    (batch,) = batches
    trained = {
        tuple(row[mask.bool()].tolist())
        for row, mask in zip(batch["input_ids"], batch["attention_mask"])
    }
    assert trained <= {tuple(ids) for ids in ds["input_ids"]}
    assert int((batch["labels"] != -100).sum()) == sum(
        sum(ds[i]["assistant_masks"]) for i in range(batch["input_ids"].shape[0])
    )


def test_a_token_level_policys_records_keep_its_own_ids(tmp_path):
    # SmolLM2's eval (gzipped records with token_ids): the ids are the record's, untouched.
    from vt_envs.core.packaged_models import resolve_model

    try:
        tokenizer = resolve_model("smollm2-135m-instruct")
    except Exception as exc:  # the package (or gguf) is not installed
        pytest.skip(f"smollm2-135m-instruct is not available: {exc}")
    records = [r for r in read_records(DOCS / "smollm2") if r["env_id"] == LOOKUP][:3]
    # Make the first action's first id a non-canonical encoding of the same text (as a
    # sampled policy may write): the export must keep it, not re-encode the text.
    tok = load_tokenizer(tokenizer)
    record = records[0]
    first = record["turns"][0]["tokens_in"]
    action = range(first, first + record["turns"][0]["tokens_out"])
    at = next(i for i in action if len(tok.decode([record["token_ids"][i]])) > 1)
    text = tok.decode([record["token_ids"][at]])
    split = tok.encode(text[0]) + tok.encode(text[1:])
    assert tok.decode(split) == text and len(split) > 1
    record["token_ids"][at : at + 1] = split
    record["turns"][0]["tokens_out"] += len(split) - 1
    assert tok.decode(record["token_ids"]) == record["transcript"]
    ds = records_to_dataset(records, tokenizer=tokenizer, split="test")
    assert ds["ids_source"] == ["policy"] * 3 and all(ds["replay_ok"])
    for row, record in zip(ds, records):
        assert row["input_ids"] == record["token_ids"]
        mask = []
        for turn in record["turns"]:
            mask += [0] * turn["tokens_in"] + [1] * turn["tokens_out"]
        assert row["assistant_masks"] == mask
        assert row["messages"][-1]["content"] == record["turns"][-1]["action"]


def test_filters_and_files(tmp_path):
    # A records file (gzipped, torn last line) works as well as a directory; failed
    # rollouts and those under min_reward are left out.
    source = [r for r in read_records(DOCS / "oracle") if r["env_id"] == LOOKUP][:3]
    source[1] = {**source[1], "error": "RuntimeError: the engine died"}
    source[2] = {**source[2], "reward": 0.0, "correct": False}
    lines = "".join(json.dumps(r) + "\n" for r in source) + '{"env_id": "VT-Lo'
    path = tmp_path / "rollouts.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(lines)
    shutil.copy(DOCS / "oracle" / "config.json", tmp_path / "config.json")
    assert records_to_dataset(path)["task_id"] == [source[0]["task_id"], source[2]["task_id"]]
    ds = records_to_dataset(tmp_path, min_reward=1.0)
    assert ds["task_id"] == [source[0]["task_id"]]
    with pytest.raises(Exception, match="no records to export"):
        records_to_dataset(tmp_path, env_ids=["VT-Math-v0"])
