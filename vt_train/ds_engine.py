"""DeepSpeed for the actor (and critic): one wrapper, ZeRO stage from the config.

On a CPU machine the trainer runs as a single process by default (this
module fills in RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
when they are unset, with the gloo backend); ``torchrun`` gives several.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vt_envs.errors import InvalidConfigError

__all__ = ["DeepSpeedConfig", "DeepSpeedModel", "FrozenDeepSpeedModel", "init_distributed_env"]


@dataclass
class DeepSpeedConfig:
    """DeepSpeed settings shared by actor and critic.

    Attributes:
        zero_stage: ZeRO stage 0-3 (3 shards parameters: GPU recipes for 7B).
        bf16: train in bfloat16 (fp32 master weights kept by DeepSpeed).
        torch_adam: use ``torch.optim.AdamW`` instead of DeepSpeed's compiled
            Adam (whose JIT build costs 40-50 s on first use on CPU).
        offload_optimizer: ZeRO-Offload of optimizer states to CPU (GPU runs).
        grad_clip: gradient-norm clipping (0 disables).
    """

    zero_stage: int = 0
    bf16: bool = False
    torch_adam: bool = True
    offload_optimizer: bool = False
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise InvalidConfigError(f"deepspeed.zero_stage must be 0-3, got {self.zero_stage}")
        if self.grad_clip < 0:
            raise InvalidConfigError(f"deepspeed.grad_clip must be >= 0, got {self.grad_clip}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The variables torchrun sets and :func:`init_distributed_env` fills in. Set in this
#: process they would reach any trainer it starts as a subprocess: drop them from its env.
RENDEZVOUS_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed_env() -> None:
    """Fill in single-process rendezvous variables when not launched by torchrun."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


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
        init_distributed_env()
        import deepspeed

        # DeepSpeed JIT-builds a shared-memory all-reduce op when its CPU
        # backend starts (minutes on a 2-core machine, on every fresh one);
        # gloo's all-reduce is enough for the model sizes trained on CPU.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
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
        if config.offload_optimizer and config.zero_stage > 0:
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


class FrozenDeepSpeedModel:
    """A forward-only model (the KL reference) under ZeRO-3: its parameters are
    partitioned like the actor's instead of held whole on every rank.

    Callable like the wrapped module; ``eval`` is a no-op (it never trains).
    """

    def __init__(self, model: torch.nn.Module, config: DeepSpeedConfig):
        init_distributed_env()
        import deepspeed

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
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
