"""What a :class:`~vt_train.trainer.Trainer` is built of: the policy, its KL reference
and critic (whole, or partitioned over the ranks under ZeRO-3), the tokenizer, the
processor of a vision-language policy, the rollout engine's keywords and the envs."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel

import vt_envs
from vt_envs.core.packaged_models import resolve_model
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.errors import InvalidConfigError
from vt_train.attention import use_cpu_gqa_attention
from vt_train.config import TrainConfig
from vt_train.ds_engine import FrozenDeepSpeedModel, zero3_construction
from vt_train.logprobs import LogprobModel
from vt_train.model import (
    CriticModel,
    TinyModelConfig,
    build_tiny_model,
    save_pretrained_with_tokenizer,
)
from vt_train.sharded_load import load_partitioned
from vt_train.vision import load_policy
from vt_train.vl_model import (
    TinyVisionConfig,
    build_tiny_vl_model,
    copy_processor_files,
    is_processor_dir,
)


def _dtype(config: TrainConfig) -> torch.dtype:
    return torch.bfloat16 if config.deepspeed.bf16 else torch.float32


def _load_partitioned(config: TrainConfig, *, base: bool = False) -> torch.nn.Module:
    """The model of ``model.path`` (``base``: its trunk, for a critic) built partitioned
    over the ranks: :func:`~vt_train.sharded_load.load_partitioned` (no rank holds all
    of it), or ``transformers``' ZeRO-3 loading for layouts that one does not cover."""
    dtype = _dtype(config)
    path = resolve_model(
        config.init_from or config.model.path,
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
    )
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": config.deepspeed.bf16},
    }
    model = load_partitioned(path, dtype=dtype, ds_config=ds_config, base=base)
    if model is not None:
        return model if base else use_cpu_gqa_attention(model)
    with zero3_construction(config.deepspeed):
        if base:
            return AutoModel.from_pretrained(str(path), local_files_only=True, dtype=dtype)
        return load_policy(path, dtype=dtype)


def _load_policy(
    config: TrainConfig, tokenizer: Any, processor_dir: Path | None
) -> torch.nn.Module:
    path = config.init_from or config.model.path
    if path is not None:
        # Loaded in the training dtype: a 7B model in fp32 is 30 GB of host RAM per rank.
        return load_policy(path, dtype=_dtype(config))
    text = TinyModelConfig(**{"seed": config.seed, **config.model.tiny})
    if config.model.vision is not None:
        assert processor_dir is not None
        return build_tiny_vl_model(text, TinyVisionConfig(**config.model.vision), processor_dir)
    return build_tiny_model(text, tokenizer)


def _processor_dir(config: TrainConfig, run_dir: Path) -> Path | None:
    """Where a vision-language policy's processor lives (``None``: a text policy)."""
    if config.model.processor is not None:
        return Path(config.model.processor)
    path = config.init_from or config.model.path
    if path is not None:
        return Path(path) if is_processor_dir(path) else None
    return run_dir / "processor" if config.model.vision is not None else None


def check_same_tokenizer(pairs: Sequence[tuple[str, Any]]) -> None:
    """Raise :class:`InvalidConfigError` unless every named tokenizer encodes alike.

    The env, the rollout engine and the trainer must share one tokenizer: the
    env's observation ids, the engine's generated ids and the trainer's
    logprobs all index one vocabulary. Compared: vocabulary size, eos and pad
    ids, and the ids of a probe text with special tokens, tags and digits.
    ``None`` entries (an engine without a tokenizer) are skipped.
    """
    probe = "<|im_start|>user\n<python>print(12 + 34)</python> héllo<|im_end|>"

    def fingerprint(tokenizer: Any) -> tuple:
        ids = tuple(tokenizer.encode(probe))
        return tokenizer.vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id, ids

    (first_name, first), *rest = pairs
    for name, tokenizer in rest:
        if tokenizer is not None and fingerprint(tokenizer) != fingerprint(first):
            raise InvalidConfigError(
                f"the {name} tokenizer ({getattr(tokenizer, 'name', tokenizer)!r}) differs from "
                f"the {first_name} tokenizer ({getattr(first, 'name', first)!r}): vocabulary, "
                "special ids or encodings disagree, so the ids one produces mean something else "
                "to the other. Give them the same tokenizer (model.tokenizer, or the model's own)"
            )


class _Building:
    """The :class:`~vt_train.trainer.Trainer` methods that build its models, its
    engine's keywords and its envs (a mixin: they read and set the trainer's state)."""

    def _build_models(
        self, config: TrainConfig
    ) -> tuple[torch.nn.Module, torch.nn.Module | None, CriticModel | None]:
        """The policy, the KL reference (if ``kl_coef > 0``) and the critic (PPO); sets
        ``self.tokenizer``. Partitioned (under :func:`zero3_construction`), each is loaded
        from the model directory; otherwise the copies are made from the policy."""
        tiny_vl = self.processor_dir is not None and config.model.path is None
        tiny_vl = tiny_vl and not config.init_from
        if tiny_vl:  # the tiny VL model writes its processor (and so its tokenizer) first
            policy = _load_policy(config, None, self.processor_dir)
        self.tokenizer = load_tokenizer(
            config.model.tokenizer
            or config.init_from
            or config.model.path
            or (str(self.processor_dir) if self.processor_dir is not None else None)
        )
        if self.partitioned:
            policy = _load_partitioned(config)
        elif not tiny_vl:
            policy = _load_policy(config, self.tokenizer, self.processor_dir)
        if config.optim.gradient_checkpointing:
            policy.gradient_checkpointing_enable()
        reference = critic = None
        if self.partitioned:
            if self.algo.kl_coef > 0:
                reference = _load_partitioned(config)
            if self.algo.use_critic:
                critic = CriticModel(_load_partitioned(config, base=True))
            return policy, reference, critic
        # Copies are made before DeepSpeed takes the policy: under ZeRO-3 its parameters
        # are partitioned (empty placeholders) afterwards.
        if self.algo.kl_coef > 0:
            reference = copy.deepcopy(policy)
        if self.algo.use_critic:
            critic = CriticModel.from_policy(policy)
        return policy, reference, critic

    def _logprob_model(self, lm: torch.nn.Module) -> LogprobModel:
        model = LogprobModel(lm, chunk_size=self.config.optim.logprob_chunk_size)
        model.lockstep = self.lockstep
        return model

    def _frozen(self, model: LogprobModel) -> Any:
        """A model that only runs forward (the reference): on the device, in the
        training dtype; under ZeRO-3 sharded by a DeepSpeed engine of its own."""
        model = model.eval().requires_grad_(False)
        ds = self.config.deepspeed
        if ds.zero_stage == 3:
            return FrozenDeepSpeedModel(model, ds)
        return model.to(device=self.device, dtype=torch.bfloat16 if ds.bf16 else torch.float32)

    def _engine_kwargs(self, policy: torch.nn.Module, device: str) -> dict[str, Any]:
        """The keywords of this rank's engine (a leader's: vt_train.placement)."""
        kwargs = dict(self.config.rollout.engine_kwargs)
        place = self.placement
        cfg = self.config
        path = cfg.init_from or cfg.model.path
        if cfg.rollout.engine == "hf":
            # a whole copy: from the directory when the policy was built partitioned
            whole = _load_policy(cfg, self.tokenizer, None) if self.partitioned else None
            kwargs.setdefault("model", whole if whole is not None else copy.deepcopy(policy))
            kwargs.setdefault("tokenizer", self.tokenizer)
            kwargs.setdefault("seed", self.config.seed)
            # on its rank's own GPU (cuda:LOCAL_RANK), not every engine on cuda:0
            gpu = device.startswith("cuda") and place.train_device is not None
            kwargs.setdefault("device", f"cuda:{place.train_device}" if gpu else device)
            if self.vision:
                kwargs.setdefault("processor", str(self.processor_dir))
        elif cfg.rollout.engine == "vllm":
            if place.engine_devices:  # its tensor-parallel group's GPUs
                kwargs.setdefault("devices", place.engine_devices)
            if self.partitioned:  # no rank has the whole policy to save: vLLM reads it
                kwargs.setdefault("model_path", str(path))
                if cfg.model.tokenizer:
                    kwargs.setdefault("tokenizer_path", cfg.model.tokenizer)
            else:
                # one directory per engine: several leaders may share a node's disk
                saved = self.run_dir / "weights" / f"initial-engine{place.engine}"
                # The policy's own tokenizer files: vLLM detokenizes (stop strings) with them.
                save_pretrained_with_tokenizer(policy, self.tokenizer, saved)
                if self.vision:  # vLLM builds its multimodal processor from the model dir
                    copy_processor_files(self.processor_dir, saved)
                kwargs.setdefault("model_path", str(saved))
            kwargs.setdefault("tokenizer", self.tokenizer)
            # the training dtype, whatever config.json says: the sync check compares the two
            kwargs.setdefault("dtype", "bfloat16" if self.config.deepspeed.bf16 else "float32")
        return kwargs

    def _make_envs(self) -> None:
        """The train and held-out vector envs (``self.train_env``, ``self.eval_env``), this
        rank's share of a step's episodes wide; checks that env, engine and trainer share
        one tokenizer; sets ``train_tasks``, ``eval_task_ids`` and the ``stop`` strings."""
        config = self.config
        env_kwargs = dict(config.env.kwargs)
        if self.vision:  # the envs expand images as this policy's processor does
            env_kwargs.setdefault("processor", str(self.processor_dir))
        batch = config.rollout.tasks_per_step // len(self.players) * config.rollout.n
        if not self.placement.leads:
            batch = 1  # never played: the env gives this rank its task list and stop strings
        where = {"backend": config.env.backend}
        if config.env.backend == "ray":
            where["ray_options"] = dict(config.env.ray)
        eval_width = min(config.env.eval_episodes, 64)
        if config.env.mixture:
            mixture = {
                "env_kwargs": config.env.member_kwargs,
                "tokenizer": self.tokenizer,
                **env_kwargs,
            }
            self.train_env = vt_envs.make_vec_mixture(
                config.env.mixture, batch, split="train", seed=config.seed, **mixture
            )
            # the held-out draw does not follow the run's seed: every run is scored on
            # the same tasks
            self.eval_env = vt_envs.make_vec_mixture(
                config.env.mixture, eval_width, split=config.env.eval_split, seed=0, **mixture
            )
        else:
            self.train_env = vt_envs.make_vec(
                config.env.id, batch, **where, split="train", tokenizer=self.tokenizer, **env_kwargs
            )
            self.eval_env = vt_envs.make_vec(
                config.env.id,
                eval_width,
                **where,
                split=config.env.eval_split,
                tokenizer=self.tokenizer,
                **env_kwargs,
            )
        check_same_tokenizer(
            [
                ("trainer", self.tokenizer),
                ("env", self.train_env.envs[0].unwrapped.tokenizer),
                ("rollout engine", getattr(self.engine, "tokenizer", None)),
            ]
        )
        # Tasks are looked up by index when drawn: listing every id of a generated
        # split would generate (and, for VT-SQL, execute) all of its tasks up front.
        self.train_tasks = self.train_env.envs[0].unwrapped.tasks
        eval_tasks = self.eval_env.envs[0].unwrapped.tasks
        self.eval_task_ids = [
            eval_tasks[i].id for i in range(min(config.env.eval_episodes, len(eval_tasks)))
        ]
        self.stop = tuple(self.train_env.stop_strings)
