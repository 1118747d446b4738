"""The RL trainer: rollout → old/ref logprobs → advantages → updates → weight sync.

One :meth:`Trainer.step` reads top to bottom like the algorithm:

1. sample ``tasks_per_step`` train tasks (a pure function of ``(seed, step)``,
   so a resumed run draws the same ones) and play ``n`` episodes of each
   through the vector env with the rollout engine (trajectory-level async);
2. with dynamic sampling (DAPO's ``filter_groups``), drop the groups whose
   rewards are all equal and play rounds of fresh tasks until the step has
   ``tasks_per_step`` groups that differ (or ``max_sampling_rounds`` ran out);
3. old logprobs (recomputed by the trainer's model, or the engine's rollout
   logprobs), reference logprobs (if KL is on) and values ``V(s_t)`` (PPO);
4. advantages from the algorithm's estimator;
5. ``epochs`` passes of minibatch updates, each minibatch split into
   micro-batches whose losses are normalized by the minibatch-wide counts;
   DeepSpeed is told where each minibatch's accumulation ends, so every ZeRO
   stage applies the same update;
6. push the new weights into the rollout engine and check that its logprobs
   on a probe agree with the trainer's (a gross gap means stale weights);
7. log metrics (JSONL + TensorBoard): losses summed over micro-batches and
   ranks, token-weighted means over every generated token of the step.

Devices: the models live on ``config.device`` (DeepSpeed's device); every
tensor the trainer builds is created there or moved there before it meets a
model.

Vision-language policies (``model.vision``, or a Qwen2-VL ``model.path``):
the processor directory goes to every env and engine; trajectories carry
their images by reference into :class:`TrainBatch`, and every forward (old,
reference and new logprobs, values, the sync probe) turns its rows' images
into pixel values for that forward only (:mod:`vt_train.vision`). Image-pad
ids are observation ids, so the loss mask never covers them.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from transformers import AutoModel

import vt_envs
from vt_envs.core.loop import run_sync
from vt_envs.core.packaged_models import resolve_model
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.errors import InvalidConfigError
from vt_train.algorithms import (
    ADVANTAGES,
    POLICY_LOSSES,
    aggregate,
    group_filter_mask,
    kl_penalty,
    kl_token_rewards,
    loss_normalizers,
    masked_mean,
    value_loss,
)
from vt_train.algorithms.shaping import shape_rewards, shaping_metrics
from vt_train.attention import use_cpu_gqa_attention
from vt_train.batch import TrainBatch
from vt_train.config import TrainConfig, resolve_device, resolved_config_dict
from vt_train.ds_engine import (
    DeepSpeedModel,
    FrozenDeepSpeedModel,
    zero3_construction,
)
from vt_train.engines import make_engine
from vt_train.engines.base import SamplingParams
from vt_train.evaluation import EvalResult, domain_metrics, evaluate, summarize
from vt_train.forwards import Forwards, Scorers
from vt_train.lockstep import Lockstep
from vt_train.logprobs import LogprobModel
from vt_train.model import (
    CriticModel,
    TinyModelConfig,
    build_tiny_model,
    save_pretrained_with_tokenizer,
)
from vt_train.placement import Placement, engine_tensor_parallel, plan_placement
from vt_train.progress import progress_bar
from vt_train.rollout import collect
from vt_train.run_dir import MetricsLogger, write_transcripts
from vt_train.sharded_load import load_partitioned
from vt_train.trajectory import Trajectory
from vt_train.vision import ImageInputs, is_vision_language, load_policy
from vt_train.vl_model import (
    TinyVisionConfig,
    build_tiny_vl_model,
    copy_processor_files,
    is_processor_dir,
)
from vt_train.weight_sync import WeightSync, probe_sequences, sync_tolerances

__all__ = ["Trainer", "check_same_tokenizer", "sync_tolerances"]

logger = logging.getLogger(__name__)

# Metrics that are masked means over a micro-batch's generated tokens: the
# step reports their token-weighted mean (not a mean of micro-batch means).
_TOKEN_MEANS = (
    "policy/clip_frac",
    "policy/dual_clip_frac",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/seq_ratio_mean",
    "critic/vf_clip_frac",
    "critic/values_mean",
)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _all_equal_share(played: Sequence[Trajectory], n: int) -> float:
    """The share of ``played``'s groups (``n`` consecutive trajectories) whose rewards
    are all equal: groups that give GRPO no signal."""
    groups = [played[g : g + n] for g in range(0, len(played), n)]
    return sum(len({t.reward for t in group}) == 1 for group in groups) / max(len(groups), 1)


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


class Trainer:
    """Owns the models, the engines and the envs of one run (see the module docstring)."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.algo = config.algorithm_config()
        self.run_dir = Path(config.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(config.torch_threads)
        _seed_everything(config.seed)
        device = resolve_device(config.device)
        if device == "cpu":  # DeepSpeed picks CUDA whenever it can see it
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # Decided before any model exists: only engine leaders build (and copy) an engine.
        self.placement, self.players = _placement(config, device)

        self.processor_dir = _processor_dir(config, self.run_dir)
        path = config.init_from or config.model.path
        # ZeRO-3 builds models loaded from a directory partitioned: no rank holds a whole one.
        self.partitioned = config.deepspeed.zero_stage == 3 and config.deepspeed.zero_init
        self.partitioned = self.partitioned and path is not None
        policy, reference, critic = self._build_models(config)
        self.vision = is_vision_language(policy)
        if self.vision and self.processor_dir is None:
            raise InvalidConfigError(
                f"the policy ({type(policy).__name__}) is a vision-language model but no "
                "processor was found: set model.processor to its processor directory (the one "
                "with preprocessor_config.json)"
            )
        self.image_inputs = ImageInputs(str(self.processor_dir)) if self.vision else None
        engine_kwargs = self._engine_kwargs(policy, device) if self.placement.leads else None
        # Shared by every LogprobModel: on several ranks their forwards agree on the
        # module calls they make (vt_train.lockstep); enabled once the world is known.
        self.lockstep = Lockstep()
        self.actor = DeepSpeedModel(
            self._logprob_model(policy),
            config.deepspeed,
            lr=config.optim.lr,
            betas=config.optim.betas,
            weight_decay=config.optim.weight_decay,
            warmup_steps=config.optim.warmup_steps,
        )
        self.device = self.actor.device
        # Data parallel under torchrun: each engine leader plays its share of the
        # step's tasks (vt_train.placement), trajectories are all-gathered, and each
        # rank trains on its rows of every minibatch (DeepSpeed all-reduces gradients).
        self.rank, self.world = _dist_rank_world()
        engines = len(self.players)
        if config.rollout.tasks_per_step % engines:
            raise InvalidConfigError(
                f"rollout.tasks_per_step ({config.rollout.tasks_per_step}) must be a multiple of "
                f"the number of rollout engines ({engines}: {self.world} ranks, one engine per "
                "tensor-parallel group) so every engine plays as many tasks"
            )
        self.is_main = self.rank == 0
        self.lockstep.enabled = self.world > 1
        self.forwards = Forwards(
            device=self.device,
            lockstep=self.lockstep,
            rank=self.rank,
            world=self.world,
            temperature=self.temperature,
            pad_token_id=self.tokenizer.pad_token_id,
            image_inputs=self.image_inputs,
            vision_config=self.actor.module.lm.config if self.vision else None,
        )
        if self.is_main:
            (self.run_dir / "config.yaml").write_text(
                yaml.safe_dump(resolved_config_dict(config), sort_keys=False)
            )
        self.reference = None if reference is None else self._frozen(self._logprob_model(reference))
        self.critic = None
        if critic is not None:
            self.critic = DeepSpeedModel(
                critic,
                config.deepspeed,
                lr=config.optim.critic_lr,
                weight_decay=config.optim.weight_decay,
                warmup_steps=config.optim.warmup_steps,
            )
        # Ranks that lead no engine (the rest of a tensor-parallel group) play no tasks.
        self.engine = (
            make_engine(config.rollout.engine, **engine_kwargs)
            if engine_kwargs is not None
            else None
        )
        self.weight_sync = WeightSync(
            self.actor, config, self._reference_logprobs,
            gather=lambda value: _all_gather(value, self.world), reporter=self.players[0],
        )  # fmt: skip

        env_kwargs = dict(config.env.kwargs)
        if self.vision:  # the envs expand images as this policy's processor does
            env_kwargs.setdefault("processor", str(self.processor_dir))
        batch = config.rollout.tasks_per_step // engines * config.rollout.n
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
        self.metrics = MetricsLogger(
            self.run_dir, tensorboard=config.tensorboard, enabled=self.is_main
        )
        self.step_index = 0
        self.updates = 0
        self.sampling_rounds = 0  # rollout rounds of the last dynamic-sampling step
        # Every trajectory the last dynamic-sampling step played, and what it returned:
        # rollout metrics describe the policy, not the groups kept for training.
        self._played: tuple[list[Trajectory], list[Trajectory]] | None = None

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

    # ------------------------------------------------------------ rollouts

    def _sample_tasks(self, step: int, round_: int = 0) -> list[str]:
        # Round 0 keeps the seed stream of earlier versions; later rounds are new streams.
        key = [self.config.seed, step] if round_ == 0 else [self.config.seed, step, round_]
        rng = np.random.default_rng(key)
        picks = rng.choice(
            len(self.train_tasks),
            size=self.config.rollout.tasks_per_step,
            replace=len(self.train_tasks) < self.config.rollout.tasks_per_step,
        )
        return [self.train_tasks[int(i)].id for i in picks]

    def _sampling(self) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop=self.stop,
        )

    def evaluate(self, temperature: float = 0.0, *, progress: bool = False) -> EvalResult:
        """Episodes on the held-out split (``env.eval_episodes`` tasks), greedy by default."""
        r = self.config.rollout
        return run_sync(
            evaluate(
                self.engine,
                self.eval_env,
                self.eval_task_ids,
                max_new_tokens=r.max_new_tokens,
                temperature=temperature,
                seed=self.config.seed,
                max_context=r.max_context,
                progress=progress,
                desc=f"eval T={temperature:g}",
            ),
            method="Trainer.evaluate",
            async_method="vt_train.evaluation.evaluate",
        )

    def _evaluate_and_log(
        self, *, transcripts: bool = False, progress: bool = False
    ) -> dict[str, float]:
        """Evaluate at every ``env.eval_temperatures`` (on rank 0); log and return the metrics."""
        metrics: dict[str, float] = {}
        if not self.is_main:
            return _broadcast(None)
        for temperature in self.config.env.eval_temperatures:
            result = self.evaluate(temperature, progress=progress)
            prefix = "eval/" if temperature == 0 else f"eval_t{temperature:g}/"
            metrics.update(result.metrics(prefix))
            if transcripts and temperature == self.config.env.eval_temperatures[0]:
                write_transcripts(
                    self.run_dir / "transcripts" / f"eval_step{self.step_index:04d}.txt",
                    result.trajectories[:8],
                    self.tokenizer,
                )
        self.metrics.log(metrics, step=self.step_index)
        return _broadcast(metrics) if self.world > 1 else metrics

    # -------------------------------------------------------------- update

    def _logprobs(
        self, model: Any, mb: TrainBatch, *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprobs (and entropy) of ``mb``'s generated tokens under ``model``, ``[B, L]``."""
        return self.forwards.logprobs(
            model, mb.input_ids, mb.attention_mask, mb.loss_mask, mb.row_images(), entropy=entropy
        )

    @property
    def temperature(self) -> float:
        return self.config.rollout.temperature or 1.0  # greedy rollouts: score at T=1

    @torch.no_grad()
    def _prepare(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """Attach old/ref logprobs, values, advantages and returns to ``batch``."""
        cfg, algo = self.config, self.algo
        batch = batch.to(self.device)
        mask = batch.loss_mask
        self.actor.eval()
        if self.critic is not None:
            self.critic.eval()
        recompute = cfg.rollout.logprobs == "recompute"
        # Each rank scores its share of the rows; the results are all-gathered.
        scored = self.forwards.score_rows(
            batch,
            Scorers(self.actor if recompute else None, self.reference, self.critic),
            cfg.optim.micro_batch_size,
        )
        old = scored["old_logprobs"] if recompute else batch.rollout_logprobs
        extras: dict[str, torch.Tensor] = {"old_logprobs": old * mask}
        gap = (old - batch.rollout_logprobs) * mask
        metrics = {
            "rollout/logprob_abs_diff": float(masked_mean(gap.abs(), mask)),
            "rollout/logprob_max_abs_diff": float(gap.abs().max()) if mask.any() else 0.0,
        }
        is_weights, is_metrics = _rollout_is_weights(gap, mask, algo)
        metrics.update(is_metrics)
        if is_weights is not None:
            extras["is_weights"] = is_weights
        token_rewards = None
        if self.reference is not None:
            extras["ref_logprobs"] = ref = scored["ref_logprobs"]
            if algo.kl_in_reward:
                token_rewards = kl_token_rewards(old, ref, mask, algo)
        values = scored.get("old_values")
        if values is not None:
            extras["old_values"] = values
        advantages, returns = ADVANTAGES.get(algo.advantage)(
            batch.rewards, mask, batch.group_ids, algo, values=values, token_rewards=token_rewards
        )
        extras.update(advantages=advantages, returns=returns)
        metrics["rollout/advantage_abs_mean"] = float(masked_mean(advantages.abs(), mask))
        return batch.with_extras(**extras), metrics

    def _gather(self, local: list[Trajectory], tasks_per_step: int) -> list[Trajectory]:
        """All engines' trajectories in global task-major order, group id = global task index.

        Engine ``e`` (led by rank ``players[e]``) played tasks ``e, e + engines, ...`` of
        the round, ``n`` samples each; the other ranks played none.
        """
        n = self.config.rollout.n
        shares = [local]
        if self.world > 1:
            import torch.distributed as dist

            shares = [None] * self.world
            dist.all_gather_object(shares, local)
        engines = len(self.players)
        trajectories = []
        for task in range(tasks_per_step):
            rank, k = self.players[task % engines], task // engines
            for trajectory in shares[rank][k * n : (k + 1) * n]:
                trajectory.group_id = task
                trajectories.append(trajectory)
        return trajectories

    def _dummy_backward(self, boundary: bool) -> None:
        """A zero-gradient pass, so a rank with no rows left makes the same module calls
        and joins the same reductions as the others (:meth:`Forwards.dummy_rows`)."""
        ids, positions, images = self.forwards.dummy_rows()
        ones = torch.ones_like(ids)
        want_entropy = self.algo.entropy_coef > 0 or self.config.optim.log_entropy
        logprobs, _ = self.forwards.logprobs(
            self.actor, ids, ones, positions, images, entropy=want_entropy
        )
        self.actor.backward(logprobs.sum() * 0.0, boundary=boundary)
        if self.critic is not None:
            values = self.forwards.values(self.critic, ids, ones, images)
            self.critic.backward(values.sum() * 0.0, boundary=boundary)

    def _micro_step(
        self, mb: TrainBatch, norm: Mapping[str, float], *, boundary: bool
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Forward and backward one micro-batch; returns ``(sums, token_sums)``:
        its share of the minibatch losses, and masked means times its token count."""
        algo = self.algo
        mask = mb.loss_mask
        want_entropy = algo.entropy_coef > 0 or self.config.optim.log_entropy
        logprobs, entropy = self._logprobs(self.actor, mb, entropy=want_entropy)
        loss_mat, pg_metrics = POLICY_LOSSES.get(algo.policy_loss)(
            logprobs, mb.extras["old_logprobs"], mb.extras["advantages"], mask, algo
        )
        if "is_weights" in mb.extras:
            loss_mat = loss_mat * mb.extras["is_weights"]
        agg = dict(num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"], config=algo)
        loss = aggregate(loss_mat, mask, algo.loss_agg, **agg)
        tokens = float((mask > 0).sum())
        sums = {"policy/pg_loss": float(loss.detach())}
        token_sums = {k: float(v) * tokens for k, v in pg_metrics.items()}
        if self.reference is not None and not algo.kl_in_reward:
            kl = aggregate(
                kl_penalty(logprobs, mb.extras["ref_logprobs"], mask, algo),
                mask,
                algo.loss_agg,
                **agg,
            )
            loss = loss + algo.kl_coef * kl
            sums["policy/kl_ref"] = float(kl.detach())
        if entropy is not None:
            ent = aggregate(entropy, mask, algo.loss_agg, **agg)
            if algo.entropy_coef:
                loss = loss - algo.entropy_coef * ent
            sums["policy/entropy"] = float(ent.detach())
        # DeepSpeed averages gradients over ranks; the loss is normalized by
        # the global counts, so scale by the world size to get their sum.
        self.actor.backward(loss * self.world, boundary=boundary)
        if self.critic is not None:
            values = self.forwards.values(
                self.critic, mb.input_ids, mb.attention_mask, mb.row_images()
            )
            v_mat, v_metrics = value_loss(
                values, mb.extras["old_values"], mb.extras["returns"], mask, algo
            )
            v_loss = algo.vf_coef * aggregate(v_mat, mask, algo.loss_agg, **agg)
            self.critic.backward(v_loss * self.world, boundary=boundary)
            sums["critic/vf_loss"] = float(v_loss.detach())
            token_sums.update({k: float(v) * tokens for k, v in v_metrics.items()})
        token_sums["_tokens"] = tokens
        return sums, token_sums

    def _update(self, batch: TrainBatch) -> dict[str, float]:
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_index)
        sums: dict[str, float] = {}
        token_sums: dict[str, float] = {}
        grad_norms: list[float] = []
        minibatches = 0
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        for _ in range(cfg.optim.epochs):
            for minibatch in batch.minibatches(
                cfg.optim.minibatch_size, shuffle=True, generator=generator
            ):
                norm = loss_normalizers(minibatch.loss_mask)  # global: the whole minibatch
                rows = minibatch.select(
                    range(self.rank, len(minibatch), self.world), normalize=False
                )
                micro = rows.split(cfg.optim.micro_batch_size) if len(rows) else []
                # every rank runs as many backward passes (each one all-reduces)
                per_rank = -(-len(minibatch) // self.world)
                passes = -(-per_rank // cfg.optim.micro_batch_size)
                for i in range(passes):
                    boundary = i == passes - 1
                    if i >= len(micro):
                        self._dummy_backward(boundary)
                        continue
                    part, part_tokens = self._micro_step(micro[i], norm, boundary=boundary)
                    _add(sums, part)
                    _add(token_sums, part_tokens)
                grad_norms.append(self.actor.step(self.updates))
                if self.critic is not None:
                    self.critic.step(self.updates)
                self.updates += 1
                minibatches += 1
        sums = _all_reduce_sums(sums, self.world, self.device)
        token_sums = _all_reduce_sums(token_sums, self.world, self.device)
        tokens = max(token_sums.pop("_tokens", 0.0), 1.0)
        metrics = {k: v / minibatches for k, v in sums.items()}  # a minibatch's loss, on average
        metrics.update({k: v / tokens for k, v in token_sums.items()})
        metrics["policy/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        return metrics

    @torch.no_grad()
    def _reference_logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        """The trainer's ``log p(token_t | tokens_<t)`` of each probe sequence, t >= 1
        (``images[i]``: sequence ``i``'s images)."""
        self.actor.eval()
        out = []
        for i, seq in enumerate(sequences):
            ids = torch.tensor([list(seq)], device=self.device)
            ones = torch.ones_like(ids)
            pictures = images[i] if images is not None else ()
            logprobs, _ = self.forwards.logprobs(
                self.actor, ids, ones, ones, pictures, temperature=temperature
            )
            out.append(logprobs[0, 1:].float().tolist())
        return out

    # ---------------------------------------------------------------- loop

    def _play(self, tasks: Sequence[str], round_: int) -> list[Trajectory]:
        """Play engine ``e``'s tasks ``e, e + engines, ...`` (if this rank leads engine
        ``e``), then gather every engine's trajectories."""
        cfg = self.config
        local: list[Trajectory] = []
        engine = self.placement.engine
        if engine is not None:
            local = run_sync(
                collect(
                    self.engine,
                    self.train_env,
                    list(tasks[engine :: len(self.players)]),
                    n_samples=cfg.rollout.n,
                    sampling=self._sampling(),
                    seed=cfg.seed * 100_003 + self.step_index * 1_009 + engine + round_ * 7_919,
                    mode=cfg.rollout.mode,
                    max_context=cfg.rollout.max_context,
                ),
                method="Trainer.rollout",
                async_method="vt_train.rollout.collect",
            )
        trajectories = self._gather(local, len(tasks))
        self._shape(trajectories)
        return trajectories

    def rollout(self) -> list[Trajectory]:
        """Play this step's tasks (this rank's share) and gather every rank's trajectories.

        With dynamic sampling (``filter_groups``), further rounds of fresh
        tasks are played until ``tasks_per_step`` groups have differing
        rewards (at most ``rollout.max_sampling_rounds`` rounds); the result
        then holds those groups only (and fewer if the rounds ran out; if none
        differ, the first round's trajectories, which :meth:`learn` logs but
        does not train on).
        """
        cfg = self.config
        trajectories = first = self._play(self._sample_tasks(self.step_index), 0)
        if not self.algo.filter_groups:
            return trajectories
        n, target = cfg.rollout.n, cfg.rollout.tasks_per_step
        kept: list[list[Trajectory]] = []
        played = list(first)
        self.sampling_rounds = 1
        while True:
            for g in range(len(trajectories) // n):
                group = trajectories[g * n : (g + 1) * n]
                if len({t.reward for t in group}) > 1 and len(kept) < target:
                    kept.append(group)
            if len(kept) >= target or self.sampling_rounds >= cfg.rollout.max_sampling_rounds:
                break
            trajectories = self._play(
                self._sample_tasks(self.step_index, self.sampling_rounds), self.sampling_rounds
            )
            played += trajectories
            self.sampling_rounds += 1
        if not kept:
            self._played = (first, played)
            return first
        for group_id, group in enumerate(kept):
            for trajectory in group:
                trajectory.group_id = group_id
        result = [t for group in kept for t in group]
        self._played = (result, played)
        return result

    def _shape(self, trajectories: Sequence[Trajectory]) -> None:
        """Truncation rule and overlong punishment (vt_train.algorithms.shaping), once per
        trajectory: as it is played, so dynamic sampling filters on shaped rewards."""
        r = self.config.rollout
        shape_rewards(
            trajectories,
            truncated=r.truncated,
            truncation_penalty=r.truncation_penalty,
            algo=self.algo,
        )

    def learn(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Update the policy (and critic) on ``trajectories``; push the new weights."""
        cfg, algo = self.config, self.algo
        played = trajectories
        if self._played is not None and self._played[0] is trajectories:
            played = self._played[1]  # every round dynamic sampling played, not only the kept
        self._played = None
        self._shape(trajectories)  # a no-op on what rollout() shaped already
        metrics = {f"rollout/{k}": v for k, v in summarize(played).items()}
        if self.config.env.mixture:  # each domain's reward, accuracy, turns, tool use
            metrics.update(domain_metrics(played, "rollout/"))
        if self.sampling_rounds:
            metrics["rollout/sampling_rounds"] = float(self.sampling_rounds)
        metrics.update(shaping_metrics(played))
        batch = TrainBatch.from_trajectories(trajectories, pad_token_id=self.tokenizer.pad_token_id)
        keep = group_filter_mask(batch.rewards, batch.group_ids)
        if played is not trajectories:
            metrics["rollout/all_equal_group_share"] = _all_equal_share(played, cfg.rollout.n)
            trained = int(keep.sum()) if algo.filter_groups else len(trajectories)
            metrics["rollout/trained_share"] = trained / max(len(played), 1)
            # rollout/* describe the policy (every round played); kept/* what trains
            kept = [t for t, k in zip(trajectories, keep.tolist()) if k or not algo.filter_groups]
            metrics.update({f"kept/{k}": v for k, v in summarize(kept).items()} if kept else {})
        else:
            metrics["rollout/all_equal_group_share"] = 1.0 - float(keep.float().mean())
        if algo.filter_groups:
            batch = (
                batch.select(torch.nonzero(keep).flatten(), normalize=True) if keep.any() else None
            )
        if batch is not None and len(batch) and batch.num_tokens:
            span = None
            if self.vision:
                lm_config = self.actor.module.lm.config
                span = (lm_config.vision_start_token_id, lm_config.vision_end_token_id)
            # One token short of the context: vLLM scores a sequence as a prompt that
            # must leave room for one generated token (prompt + 1 <= max_model_len).
            probe, images = probe_sequences(trajectories, cfg.rollout.max_context - 1, span)
            before = self.weight_sync.probe(self.engine, probe, images)  # for the sync check
            batch, prep_metrics = self._prepare(batch)
            metrics.update({**prep_metrics, **self._update(batch)})
            metrics.update(self.weight_sync.sync(self.engine, probe, images, before))
        return metrics

    def step(self) -> dict[str, float]:
        """One RL step (:meth:`rollout` then :meth:`learn`); returns its metrics (also logged).

        ``metrics["step"]`` is the number of steps done, the same step the
        record is logged under.
        """
        t0 = time.perf_counter()
        trajectories = self.rollout()
        t1 = time.perf_counter()
        metrics = self.learn(trajectories)
        t2 = time.perf_counter()
        tokens = sum(len(t.input_ids) for t in trajectories)
        self.step_index += 1
        metrics.update(
            {
                "step": self.step_index,
                "time/rollout_s": t1 - t0,
                "time/update_s": t2 - t1,
                "perf/train_tokens_per_s": tokens / max(t2 - t1, 1e-9),
                "perf/rollout_tokens_per_s": tokens / max(t1 - t0, 1e-9),
            }
        )
        self.metrics.log(metrics, step=self.step_index)
        return metrics

    def train(self, *, progress: bool = True) -> dict[str, Any]:
        """Run until ``config.steps``; evaluate before, during and after; save at the end."""
        cfg = self.config
        summary: dict[str, Any] = {}
        if self.step_index == 0:
            summary["before"] = self._evaluate_and_log(transcripts=True, progress=progress)
        bar = progress_bar(range(self.step_index, cfg.steps), desc="RL steps", enabled=progress)
        for _ in bar:
            metrics = self.step()
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(
                    reward=f"{metrics['rollout/mean_reward']:.2f}",
                    tool=f"{metrics['rollout/tool_use_rate']:.2f}",
                )
            last = self.step_index == cfg.steps  # the final evaluation follows the loop
            if cfg.eval_every and self.step_index % cfg.eval_every == 0 and not last:
                self._evaluate_and_log(progress=progress)
            if cfg.save_every and self.step_index % cfg.save_every == 0:
                self.save_checkpoint()
        summary["after"] = self._evaluate_and_log(transcripts=True, progress=progress)
        self.save_checkpoint()
        state = self.actor.full_state_dict()  # collective under ZeRO-3
        if self.is_main:
            save_pretrained_with_tokenizer(
                self.actor.module.lm, self.tokenizer, self.run_dir / "final", state_dict=state
            )
            if self.vision:
                copy_processor_files(self.processor_dir, self.run_dir / "final")
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        return summary

    # --------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        """Model, optimizer and RNG state; :meth:`load_checkpoint` resumes exactly."""
        directory = self.run_dir / "checkpoints"
        tag = f"step{self.step_index:05d}"
        state = {
            "step_index": self.step_index,
            "updates": self.updates,
            "rng_python": random.getstate(),
            "rng_numpy": np.random.get_state(),
            "rng_torch": torch.get_rng_state(),
        }
        self.actor.save_checkpoint(directory / "actor", tag, state)
        if self.critic is not None:
            self.critic.save_checkpoint(directory / "critic", tag, {})
        if self.is_main:
            (directory / "latest").write_text(tag)
        return directory / "actor" / tag

    def load_checkpoint(self, tag: str | None = None) -> None:
        """Restore a checkpoint; metrics logged after it (by the interrupted run) are dropped."""
        directory = self.run_dir / "checkpoints"
        tag = tag or (directory / "latest").read_text().strip()
        state = self.actor.load_checkpoint(directory / "actor", tag)
        if self.critic is not None:
            self.critic.load_checkpoint(directory / "critic", tag)
        self.step_index, self.updates = state["step_index"], state["updates"]
        random.setstate(state["rng_python"])
        np.random.set_state(state["rng_numpy"])
        torch.set_rng_state(state["rng_torch"])
        self.metrics.truncate_after(self.step_index)
        self.weight_sync.push(self.engine)

    def close(self) -> None:
        self.train_env.close()
        self.eval_env.close()
        if self.engine is not None:
            run_sync(self.engine.aclose(), method="Trainer.close", async_method="engine.aclose")


def _rollout_is_weights(
    gap: torch.Tensor, mask: torch.Tensor, algo: Any
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Truncated importance weights ``min(p_trainer / p_rollout, cap)`` (token or sequence
    level, ``algo.rollout_is``), and their metrics, which are logged either way."""
    m = mask > 0
    token = torch.exp(gap.clamp(max=20.0))
    seq = torch.exp((gap * m).sum(-1).clamp(max=20.0))
    metrics = {
        "rollout/is_token_weight_mean": float(masked_mean(token, m)),
        "rollout/is_token_clip_frac": float(masked_mean((token > algo.rollout_is_cap).float(), m)),
    }
    if algo.rollout_is is None:
        return None, metrics
    if algo.rollout_is == "token":
        weights = token.clamp(max=algo.rollout_is_cap)
    else:
        weights = seq.clamp(max=algo.rollout_is_cap)[:, None].expand_as(gap)
    return torch.where(m, weights, 0.0), metrics


def _add(into: dict[str, float], values: Mapping[str, float]) -> None:
    for key, value in values.items():
        into[key] = into.get(key, 0.0) + value


def _all_reduce_sums(sums: dict[str, float], world: int, device: torch.device) -> dict[str, float]:
    """``sums`` added over every rank (keys the union of all ranks')."""
    if world == 1:
        return dict(sums)
    import torch.distributed as dist

    keys: list[list[str]] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(keys, sorted(sums))
    union = sorted({k for ks in keys for k in ks})
    values = torch.tensor([sums.get(k, 0.0) for k in union], dtype=torch.float64, device=device)
    dist.all_reduce(values)
    return dict(zip(union, values.cpu().tolist()))


def _all_gather(value: Any, world: int) -> list[Any]:
    """Every rank's ``value``, by rank (``[value]`` in a single process)."""
    if world == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values


def _placement(config: TrainConfig, device: str) -> tuple[Placement, list[int]]:
    """This rank's :class:`Placement` and the ranks that lead an engine (engine order),
    from the launch's variables (torchrun's, or a single process's defaults)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    plan = plan_placement(
        world=world,
        local_world=local_world,
        gpus_per_node=gpus,
        tensor_parallel=engine_tensor_parallel(
            config.rollout.engine, config.rollout.engine_kwargs if gpus else {}
        ),
    )
    return plan[rank], [p.rank for p in plan if p.leads]


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (no-op in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
