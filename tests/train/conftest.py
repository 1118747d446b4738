"""Shared setup for the trainer tests."""

from __future__ import annotations

import torch

# Under load, torch with 2 threads on this class of machine is up to 10x
# slower than with 1; the tests use tiny tensors, so one thread is plenty.
torch.set_num_threads(1)
