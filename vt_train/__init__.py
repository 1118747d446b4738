"""vt_train: batched vLLM / Hugging Face policies over VT vector envs, updated
with PPO / GRPO (and variants) on DeepSpeed.

    vt-train configs/lookup_grpo_cpu.yaml algo=ppo rollout.n=8

Dependencies point one way: ``vt_train`` imports ``vt_envs``, never the reverse.
Heavy modules (torch, transformers, deepspeed) load on first attribute access,
so ``import vt_train`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "TrainConfig": "vt_train.config",
    "load_config": "vt_train.config",
    "Trainer": "vt_train.trainer",
    "Trajectory": "vt_train.trajectory",
    "TrainBatch": "vt_train.batch",
    "collect": "vt_train.rollout",
    "evaluate": "vt_train.evaluation",
    "RolloutEngine": "vt_train.engines.base",
    "SamplingParams": "vt_train.engines.base",
    "Generation": "vt_train.engines.base",
    "make_engine": "vt_train.engines",
    "AlgorithmConfig": "vt_train.algorithms",
    "ADVANTAGES": "vt_train.algorithms",
    "POLICY_LOSSES": "vt_train.algorithms",
    "LOSS_AGG": "vt_train.algorithms",
    "KL_ESTIMATORS": "vt_train.algorithms",
    "PRESETS": "vt_train.algorithms",
    "TinyModelConfig": "vt_train.model",
    "build_tiny_model": "vt_train.model",
    "SFTConfig": "vt_train.sft",
    "run_sft": "vt_train.sft",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vt_train' has no attribute {name!r}")
