"""``vt-bench sync-speed`` and ``zero3-memory``: the weight-sync and ZeRO-3 loading
measurements run and check what they measure (the engine serves the synced weights;
every rank reports)."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest


def _run(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.main(parser.parse_args(argv))


def _sync_speed(tmp_path, *extra):
    from vt_bench import sync_speed

    assert (
        _run(sync_speed, ["--model", "tiny", "--rounds", "2", "--out", str(tmp_path), *extra]) == 0
    )
    return json.loads((tmp_path / "sync_speed.json").read_text())


def test_sync_speed_compares_a_streamed_and_a_whole_sync_that_both_land(tmp_path, capsys):
    report = _sync_speed(tmp_path)
    assert set(report["sides"]) == {"hf/streamed", "hf/whole"}
    for side in report["sides"].values():
        assert side["seconds"] > 0
        assert side["max_abs_diff"] < 1e-4  # the engine serves the nudged weights
    assert "| hf | streamed |" in capsys.readouterr().out


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_sync_speed_with_vllm_syncs_through_memory_and_through_a_file(tmp_path):
    report = _sync_speed(tmp_path, "--vllm", "--bucket-mb", "1")
    assert {"vllm/streamed", "vllm/whole"} <= set(report["sides"])
    for key in ("vllm/streamed", "vllm/whole"):
        assert report["sides"][key]["max_abs_diff"] < 1e-3


@pytest.mark.slow
def test_zero3_memory_reports_every_rank_for_every_loading(tmp_path):
    from vt_bench import zero3_memory
    from vt_envs.core.tokenizer import load_tokenizer
    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    model, tok = str(tmp_path / "model"), load_tokenizer()
    save_pretrained_with_tokenizer(build_tiny_model(TinyModelConfig(), tok), tok, model)
    assert _run(zero3_memory, ["--model", model, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "zero3_memory.json").read_text())
    assert list(report["modes"]) == ["sharded", "transformers", "whole"]
    for records in report["modes"].values():
        assert [r["rank"] for r in records] == [0, 1]
        assert all(r["parameters"] == records[0]["parameters"] > 0 for r in records)
