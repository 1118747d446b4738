"""Fail-closed sandbox for model-written Python and bash.

- :mod:`~vt_envs.sandbox.policy`: limits and isolation names (:class:`SandboxPolicy`).
- :mod:`~vt_envs.sandbox.isolation`: picking and composing the layers; fails closed.
- :mod:`~vt_envs.sandbox.process`: one sandboxed process tree, output caps, kill.
- :mod:`~vt_envs.sandbox.python_worker` / :mod:`~vt_envs.sandbox.bash_session`:
  the per-episode interpreter and shell.
- ``inside.py``: the stdlib-only code that runs inside the sandbox.
"""

from vt_envs.sandbox.bash_session import BashOutcome, BashSession
from vt_envs.sandbox.isolation import Isolation, describe, find_bwrap, resolve_isolation
from vt_envs.sandbox.policy import (
    ISOLATION_MODES,
    UNSAFE_ISOLATION,
    SandboxPolicy,
    UnsafeSandboxWarning,
)
from vt_envs.sandbox.process import Captured, SandboxProcess
from vt_envs.sandbox.python_worker import PythonOutcome, PythonWorker, WarmPool

__all__ = [
    "ISOLATION_MODES",
    "UNSAFE_ISOLATION",
    "BashOutcome",
    "BashSession",
    "Captured",
    "Isolation",
    "PythonOutcome",
    "PythonWorker",
    "SandboxPolicy",
    "SandboxProcess",
    "UnsafeSandboxWarning",
    "WarmPool",
    "describe",
    "find_bwrap",
    "resolve_isolation",
]
