"""Rollout engines behind one protocol (:class:`RolloutEngine`), by name.

``make_engine("hf", model=..., tokenizer=...)`` builds one; ``ENGINES.names()``
lists them. The vLLM backend imports ``vllm`` only when constructed, so this
package imports without it.
"""

from __future__ import annotations

import inspect
from typing import Any

from vt_envs.errors import UnknownKwargError

from ..registry import Registry
from .base import (
    EngineClosedError,
    FinishReason,
    Generation,
    RolloutEngine,
    SamplingParams,
    StopChecker,
)
from .hf import HFEngine
from .scripted import ScriptedEngine
from .sync_check import (
    WeightSyncError,
    assert_in_sync,
    assert_moved_with_trainer,
    logprob_agreement,
)
from .vllm import VLLMEngine, VLLMUnavailableError

__all__ = [
    "ENGINES",
    "EngineClosedError",
    "FinishReason",
    "Generation",
    "HFEngine",
    "RolloutEngine",
    "SamplingParams",
    "ScriptedEngine",
    "StopChecker",
    "VLLMEngine",
    "VLLMUnavailableError",
    "WeightSyncError",
    "assert_in_sync",
    "assert_moved_with_trainer",
    "logprob_agreement",
    "make_engine",
]

ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine")
ENGINES.register("hf")(HFEngine)
ENGINES.register("scripted")(ScriptedEngine)
ENGINES.register("vllm")(VLLMEngine)


def make_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered as ``name`` with ``kwargs``.

    Raises :class:`~vt_envs.errors.UnknownNameError` for an unknown name and
    :class:`~vt_envs.errors.UnknownKwargError` for a keyword the engine's
    constructor does not take (both say what would have been valid).
    """
    cls = ENGINES.get(name)
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    if not takes_any:
        names = [n for n in accepted if n != "self"]
        for key in kwargs:
            if key not in accepted:
                raise UnknownKwargError(f"make_engine({name!r})", key, names)
    return cls(**kwargs)
