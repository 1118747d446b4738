"""DeepSpeed for the actor (and critic): one wrapper, ZeRO stage from the config.

On a CPU machine the trainer runs as a single process by default (this
module fills in RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
when they are unset, with the gloo backend); ``torchrun`` gives several.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vt_envs.errors import InvalidConfigError

__all__ = [
    "DeepSpeedConfig",
    "DeepSpeedModel",
    "FrozenDeepSpeedModel",
    "init_distributed_env",
    "zero3_construction",
]


@dataclass
class DeepSpeedConfig:
    """DeepSpeed settings shared by actor and critic.

    Attributes:
        zero_stage: ZeRO stage 0-3 (3 shards parameters: GPU recipes for 7B).
        bf16: train in bfloat16 (fp32 master weights kept by DeepSpeed).
        torch_adam: use ``torch.optim.AdamW`` instead of DeepSpeed's compiled
            Adam (whose JIT build costs 40-50 s on first use on CPU).
        zero_init: under ZeRO-3, build models loaded from a directory already
            partitioned (``deepspeed.zero.Init``; :func:`zero3_construction`),
            so no rank ever holds a whole model in host or GPU memory.
            ``false`` loads each whole, then partitions it.
        offload_optimizer: ZeRO-Offload of optimizer states to CPU (GPU runs).
            Needs ``zero_stage >= 1`` and DeepSpeed's own CPU Adam
            (``torch_adam: false``): DeepSpeed refuses a torch optimizer with
            offloaded states.
        grad_clip: gradient-norm clipping (0 disables).
    """

    zero_stage: int = 0
    bf16: bool = False
    torch_adam: bool = True
    zero_init: bool = True
    offload_optimizer: bool = False
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise InvalidConfigError(f"deepspeed.zero_stage must be 0-3, got {self.zero_stage}")
        if self.grad_clip < 0:
            raise InvalidConfigError(f"deepspeed.grad_clip must be >= 0, got {self.grad_clip}")
        if self.offload_optimizer and self.zero_stage == 0:
            raise InvalidConfigError(
                "deepspeed.offload_optimizer=true needs ZeRO: zero_stage is 0, where nothing is "
                "offloaded. Set deepspeed.zero_stage to 1, 2 or 3, or offload_optimizer=false"
            )
        if self.offload_optimizer and self.torch_adam:
            raise InvalidConfigError(
                "deepspeed.offload_optimizer=true with torch_adam=true: DeepSpeed keeps offloaded "
                "optimizer states only with its own CPU Adam and refuses torch.optim.AdamW at "
                "start-up. Set deepspeed.torch_adam=false (DeepSpeed builds its CPU Adam on first "
                "use), or offload_optimizer=false"
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The variables torchrun sets and :func:`init_distributed_env` fills in. Set in this
#: process they would reach any trainer it starts as a subprocess: drop them from its env.
RENDEZVOUS_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed_env() -> Any:
    """Fill in single-process rendezvous variables when not launched by torchrun, and
    return ``deepspeed``, ready to start its process group (before its first use)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import deepspeed

    # DeepSpeed JIT-builds a shared-memory all-reduce op when its CPU backend starts
    # (minutes on a 2-core machine, on every fresh one); gloo's all-reduce is enough
    # for the model sizes trained on CPU.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


@contextlib.contextmanager
def zero3_construction(config: DeepSpeedConfig) -> Iterator[None]:
    """While inside, ``transformers``' ``from_pretrained`` builds models partitioned over
    the ranks (``deepspeed.zero.Init``) and loads each checkpoint tensor straight into
    its shards: a rank holds ``1 / world`` of each model, never the whole.

    Copies of a model built so cannot be made with ``copy.deepcopy`` (its parameters
    are placeholders): load each copy (reference, critic trunk) from the directory
    inside the same block. Models meant to stay whole (an HF rollout engine) are
    loaded after it.
    """
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    init_distributed_env()
    # transformers keeps only a weak reference: this object must live through the loads.
    hf_config = HfDeepSpeedConfig(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3},
            "bf16": {"enabled": config.bf16},
        }
    )
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del hf_config


class DeepSpeedModel:
    """A model (actor or critic) trained by a DeepSpeed engine.

    The caller computes a loss per micro-batch (already normalized by the
    *minibatch*-wide token or sequence count, so accumulation is exact) and
    calls :meth:`backward` with ``boundary=True`` on the minibatch's last
    micro-batch only; :meth:`step` then applies the update. The boundary is
    what DeepSpeed's ZeRO-1/2 need to know: they reduce the accumulated
    gradients into their partitions at a boundary, and a boundary at every
    micro-batch would keep only the last one's gradient. DeepSpeed's own
    ``gradient_accumulation_steps`` stays 1 (no loss rescaling), so the number
    of micro-batches may differ between minibatches.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: DeepSpeedConfig,
        *,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
    ):
        deepspeed = init_distributed_env()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = (
            torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
            if config.torch_adam
            else None
        )
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": config.grad_clip,
            "steps_per_print": 1 << 30,
            "bf16": {"enabled": config.bf16},
            "zero_optimization": {"stage": config.zero_stage},
            "wall_clock_breakdown": False,
        }
        if config.offload_optimizer:  # validated: ZeRO 1-3, DeepSpeed's CPU Adam
            ds_config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        if optimizer is None:
            ds_config["optimizer"] = {
                "type": "AdamW",
                "params": {"lr": lr, "weight_decay": weight_decay, "betas": list(betas)},
            }
        self.warmup_steps = warmup_steps
        self.base_lr = lr
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=params, config=ds_config
        )
        self.config = config

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    def train(self) -> None:
        self.engine.train()

    def eval(self) -> None:
        self.engine.eval()

    @property
    def device(self) -> torch.device:
        """Where the engine keeps the model (inputs must go there)."""
        return torch.device(self.engine.device)

    def backward(self, loss: torch.Tensor, *, boundary: bool) -> None:
        """Accumulate gradients of one micro-batch's (globally normalized) loss;
        ``boundary``: this is the minibatch's last micro-batch (see the class docstring)."""
        self.engine.set_gradient_accumulation_boundary(boundary)
        # DeepSpeed scales by 1/gradient_accumulation_steps (= 1 here): no rescaling.
        self.engine.backward(loss)

    def step(self, update: int) -> float:
        """Apply the accumulated gradients (linear warmup by ``update``); return the
        global gradient norm before clipping, from DeepSpeed (every ZeRO stage)."""
        lr = (
            self.base_lr * min(1.0, (update + 1) / self.warmup_steps)
            if self.warmup_steps
            else self.base_lr
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        manual = None
        if self.config.zero_stage == 0:  # DeepSpeed reports a norm only when it clips
            grads = [
                p.grad.detach().float() for p in self.module.parameters() if p.grad is not None
            ]
            manual = (
                float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
                if grads
                else 0.0
            )
        self.engine.step()
        reported = self.engine.get_global_grad_norm()
        if reported is not None:
            return float(reported)
        return manual if manual is not None else float("nan")

    def _weights_module(self) -> torch.nn.Module:
        # A LogprobModel wraps the Hugging Face model: sync and export its own names.
        return getattr(self.module, "lm", self.module)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full (gathered under ZeRO-3) fp32 state dict, on CPU, for weight sync."""
        module = self._weights_module()
        if self.config.zero_stage == 3:
            import deepspeed

            params = list(module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
        return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}

    def named_weights(
        self, dtype: torch.dtype, *, bucket_bytes: int = 256 << 20
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's weights as ``(name, tensor)`` pairs in ``dtype`` on the CPU, one at
        a time, for a weight sync that never holds a whole copy of the model.

        Under ZeRO-3 parameters are gathered ``bucket_bytes`` (of the full tensors) at a
        time and released before the next bucket: the gathers are collectives, so every
        rank must walk the whole stream. On the host there is one tensor's copy at a
        time (unless the consumer keeps them). A tied weight is copied once and yielded under
        each of its names (vLLM re-processes a tied head only when it receives it);
        persistent buffers come too. Each yielded tensor is a copy the consumer may keep.
        """
        module = self._weights_module()
        names: dict[int, list[str]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for name, tensor in module.state_dict(keep_vars=True).items():  # params and buffers
            names.setdefault(id(tensor), []).append(name)
            tensors[id(tensor)] = tensor
        entries = [(key, tensors[key]) for key in names]
        if self.config.zero_stage != 3:
            for key, tensor in entries:
                copy = tensor.detach().to(device="cpu", dtype=dtype, copy=True)
                yield from ((name, copy) for name in names[key])
            return
        import deepspeed

        itemsize = torch.empty((), dtype=dtype).element_size()
        for bucket in _buckets(entries, bucket_bytes, itemsize):
            params = [t for _, t in bucket if hasattr(t, "ds_id")]
            # One host copy at a time, yielded while the bucket is gathered (the other
            # ranks wait at the release's collective meanwhile).
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                for key, tensor in bucket:
                    copy = tensor.detach().to(device="cpu", dtype=dtype, copy=True)
                    yield from ((name, copy) for name in names[key])

    def save_checkpoint(
        self, directory: str | Path, tag: str, client_state: Mapping[str, Any]
    ) -> None:
        """Model, optimizer and scheduler state plus ``client_state`` (RNGs, counters)."""
        self.engine.save_checkpoint(str(directory), tag=tag, client_state=dict(client_state))

    def load_checkpoint(self, directory: str | Path, tag: str) -> dict[str, Any]:
        _, client_state = self.engine.load_checkpoint(str(directory), tag=tag)
        if client_state is None:
            raise InvalidConfigError(f"no checkpoint {tag!r} in {directory}")
        return client_state


def _buckets(
    entries: Sequence[tuple[Any, torch.Tensor]], bucket_bytes: int, itemsize: int
) -> Iterator[list[tuple[Any, torch.Tensor]]]:
    """``entries`` in consecutive groups of at most ``bucket_bytes`` (a larger tensor
    alone); sizes are of the full tensors (``ds_numel`` under ZeRO-3)."""
    bucket: list[tuple[Any, torch.Tensor]] = []
    size = 0
    for name, tensor in entries:
        n = getattr(tensor, "ds_numel", tensor.numel()) * itemsize
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket


class FrozenDeepSpeedModel:
    """A forward-only model (the KL reference) under ZeRO-3: its parameters are
    partitioned like the actor's instead of held whole on every rank.

    Callable like the wrapped module; ``eval`` is a no-op (it never trains).
    """

    def __init__(self, model: torch.nn.Module, config: DeepSpeedConfig):
        deepspeed = init_distributed_env()
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "bf16": {"enabled": config.bf16},
            "zero_optimization": {"stage": 3},
            "steps_per_print": 1 << 30,
        }
        self.engine, *_ = deepspeed.initialize(model=model, config=ds_config)
        self.engine.eval()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    def eval(self) -> None:
        self.engine.eval()
