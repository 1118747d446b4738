"""A :class:`~vt_train.trainer.Trainer`'s checkpoints: the actor's (and critic's)
DeepSpeed state, the step counters and every RNG's state, so a resumed run goes on
exactly where the saved one was."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch


class _Checkpoints:
    """The :class:`~vt_train.trainer.Trainer` methods that save and restore a run
    (a mixin: they read and set the trainer's state)."""

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
