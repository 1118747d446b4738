"""The per-GPU memory estimate: parameter counts against transformers, activations
against the tensors autograd really keeps, ZeRO partitioning, and the recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vt_train.config import load_config
from vt_train.logprobs import LogprobModel
from vt_train.memory import (
    KNOWN_SHAPES,
    GiB,
    ModelShape,
    activation_bytes,
    estimate_memory,
    model_shape,
)

CONFIGS = Path(__file__).parents[2] / "configs"
GPU_RECIPES = sorted(p.name for p in CONFIGS.glob("*.yaml") if "qwen" in p.name)


def _hf_config(shape: ModelShape) -> Qwen2Config:
    return Qwen2Config(
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
    )


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "7b"])
def test_parameter_counts_match_transformers(size):
    shape = KNOWN_SHAPES[size]
    with torch.device("meta"):  # shapes only, no memory
        model = Qwen2ForCausalLM(_hf_config(shape))
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert ModelShape.from_hf_config(_hf_config(shape).to_dict()).num_params == shape.num_params


def _saved_bytes(checkpointing: bool) -> tuple[float, ModelShape, int]:
    """Bytes autograd saves for the backward of one LogprobModel forward (fp32)."""
    config = Qwen2Config(
        hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=512, vocab_size=1024, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    ids = torch.randint(0, 1024, (2, 256), generator=torch.Generator().manual_seed(0))
    storages: dict[int, int] = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        LogprobModel(model, chunk_size=64)(ids, torch.ones_like(ids), positions=None)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(n for ptr, n in storages.items() if ptr not in weights)
    return saved, ModelShape.from_hf_config(config.to_dict()), ids.numel()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_is_close_to_what_autograd_keeps(checkpointing):
    saved, shape, tokens = _saved_bytes(checkpointing)
    kept, _ = activation_bytes(shape, tokens, 4, checkpointing)
    assert 0.7 < saved / kept < 1.3, (saved, kept)


def test_zero_stages_partition_what_the_zero_paper_says():
    def parts(stage):
        config = load_config(None, [f"deepspeed.zero_stage={stage}", "deepspeed.bf16=true"])
        return estimate_memory(config, KNOWN_SHAPES["7b"], gpus=8).parts

    p = KNOWN_SHAPES["7b"].num_params
    assert parts(0)["actor optimizer (fp32)"] == 12 * p
    assert parts(1)["actor optimizer (fp32)"] == 12 * p / 8 and parts(1)["actor gradients"] == 2 * p
    assert parts(2)["actor gradients"] == 2 * p / 8 and parts(2)["actor weights"] == 2 * p
    assert parts(3)["actor weights"] == 2 * p / 8


def test_model_shape_from_the_path_or_its_config_json(tmp_path):
    config = load_config(CONFIGS / "math_dapo_qwen2.5-7b.yaml", [])
    assert model_shape(config) == KNOWN_SHAPES["7b"]  # "models/Qwen2.5-Math-7B", not on disk
    (tmp_path / "config.json").write_text(_hf_config(KNOWN_SHAPES["0.5b"]).to_json_string())
    local = load_config(None, [f"model.path={tmp_path}"])
    assert model_shape(local).num_params == KNOWN_SHAPES["0.5b"].num_params
    assert model_shape(load_config(None, ["model.path=models/my-own-model"])) is None


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_gpu_recipe_fits_on_eight_80gb_gpus(recipe):
    config = load_config(CONFIGS / recipe, [])
    estimate = estimate_memory(config, model_shape(config), gpus=8, gpu_gib=80)
    assert estimate.fits, estimate.table()


def test_the_estimate_catches_a_recipe_without_gradient_checkpointing():
    config = load_config(
        CONFIGS / "math_grpo_qwen2.5-1.5b.yaml", ["optim.gradient_checkpointing=false"]
    )
    estimate = estimate_memory(config, model_shape(config), gpus=8, gpu_gib=80)
    assert not estimate.fits and estimate.parts["activations (one micro-batch)"] > 60 * GiB


def test_vt_train_check_prints_the_estimate(capsys):
    from vt_train.cli import main

    assert main(["check", str(CONFIGS / "math_grpo_qwen2.5-1.5b.yaml"), "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU, Qwen2.5-1.5B (1.54B parameters) on 4 x 80 GiB" in out
    assert "vLLM reservation (50% x 1 shard)" in out and ": fits" in out
    assert "4 engine(s) x TP 1 on 4 GPUs: each GPU holds one shard" in out


def _seven_b(*overrides: str):
    config = load_config(CONFIGS / "math_dapo_qwen2.5-7b.yaml", list(overrides))
    return estimate_memory(config, KNOWN_SHAPES["7b"], gpus=8, gpu_gib=80)


def test_the_estimate_counts_tensor_parallel_engines_per_gpu():
    """The 7B recipe: 8 ranks, TP 2. Each of 8 ranks once started its own two-GPU
    engine (16 shards on 8 GPUs, twice the reservation on each: about 104 GiB); the
    placement puts 4 engines on disjoint pairs, one shard per GPU."""
    estimate = _seven_b()
    assert estimate.parts["vLLM reservation (45% x 1 shard)"] == 0.45 * 80 * GiB
    assert "4 engine(s) x TP 2 on 8 GPUs" in estimate.table()
    assert "7.1 GiB of weights" in estimate.table()  # 7.62B x 2 bytes / TP 2
    assert estimate.fits
    three = _seven_b("rollout.engine_kwargs={tensor_parallel_size: 3}")
    assert not three.fits and "does not divide the 8 ranks" in three.table()
    starved = _seven_b(
        "rollout.engine_kwargs={tensor_parallel_size: 1, gpu_memory_utilization: 0.1}"
    )
    assert not starved.fits and "cannot hold its weight shard" in starved.table()


def test_host_ram_per_rank_counts_partitioned_loading_and_a_streamed_sync():
    zero3 = _seven_b().host_bytes
    assert zero3["loading weights"] == KNOWN_SHAPES["7b"].num_params * 2 / 8
    embedding = KNOWN_SHAPES["7b"].embedding_params * 2  # the largest tensor, in bf16
    assert zero3["weight sync (streamed)"] == 2 * 64 * 2**20 + embedding
    zero2 = _seven_b("deepspeed.zero_stage=2").host_bytes
    assert zero2["loading weights"] == KNOWN_SHAPES["7b"].num_params * 2
