"""The trainer's registries are :class:`vt_envs.core.registry.Registry` (one
implementation for every registry VT reads by name): advantage estimators,
policy losses, aggregation modes, KL estimators, presets and engines are
entries, not if/else chains; ``"module:attr"`` loads user code by reference."""

from __future__ import annotations

from vt_envs.core.registry import Registry

__all__ = ["Registry"]
