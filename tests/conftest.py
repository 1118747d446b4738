"""Shared fixtures: small tools and task sources for testing the env core."""

from __future__ import annotations

import os
import signal
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A suite started with SIGINT ignored (a background job of a non-interactive shell:
# `cmd &`) has no KeyboardInterrupt at all, in itself or in the Pythons it starts, and
# the Ctrl-C tests would test the launcher instead of VT. Python's own handler, as an
# interactive run has it (children then start with the default disposition too).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from env_helpers import EchoTool

from vt_envs.core.task import Task, TaskList

SANDBOX_ENV_ID = "VTTest/Sandbox-v0"


@pytest.fixture(autouse=True)
def _no_leaked_rendezvous():
    """An in-process trainer fills in MASTER_PORT and the rest (``init_distributed_env``);
    left in ``os.environ`` they reach every later subprocess, whose single-process
    trainer then binds a port long since reused (EADDRINUSE). Drop what a test set."""
    before = dict(os.environ)
    yield
    ds_engine = sys.modules.get("vt_train.ds_engine")
    for key in getattr(ds_engine, "RENDEZVOUS_VARS", ()):
        if key not in before:
            os.environ.pop(key, None)


@pytest.fixture
def echo_tool() -> EchoTool:
    return EchoTool(timeout_s=2.0)


def make_sandbox_env(*, timeout_s: float = 1.5, python_mode: str = "persistent", **env_kwargs):
    """An env with the sandboxed python and bash tools (small limits), for contract tests."""
    from vt_envs import ExactMatch, ToolEnv
    from vt_envs.sandbox.policy import SandboxPolicy
    from vt_envs.tools.bash import BashTool
    from vt_envs.tools.python import PythonTool

    policy = SandboxPolicy(memory_mb=512, workdir_mb=32, processes=32, max_output_bytes=64 << 10)
    return ToolEnv(
        tools=[
            PythonTool(timeout_s=timeout_s, policy=policy, mode=python_mode),
            BashTool(timeout_s=timeout_s, policy=policy),
        ],
        tasks=TaskList([Task(id="t0", prompt="Run code.", gold="0")], name="sandbox"),
        verifier=ExactMatch(),
        instructions="Run code.",
        max_turns=50,
        name=SANDBOX_ENV_ID,
        **env_kwargs,
    )


def _unregister(env_id: str) -> None:
    import gymnasium as gym

    from vt_envs import registration as vt_registration

    vt_registration._REGISTRY.pop(env_id, None)
    gym.envs.registry.pop(env_id, None)


@pytest.fixture
def register_temporary():
    """``register_temporary(env_id, builder=..., **register_env_kwargs)``: register env
    ids for one test (``oracle=None`` and a description by default); all are removed
    from VT's and Gymnasium's registries when the test ends."""
    from vt_envs import register_env

    registered: list[str] = []

    def register(env_id: str, **kwargs):
        kwargs.setdefault("oracle", None)
        kwargs.setdefault("description", "tests")
        registered.append(env_id)
        return register_env(env_id, **kwargs)

    yield register
    for env_id in registered:
        _unregister(env_id)


@pytest.fixture(scope="session")
def sandbox_env_id():
    """Registers ``VTTest/Sandbox-v0`` (python + bash) for the test session only."""

    from vt_envs import env_builder, register_env

    register_env(
        SANDBOX_ENV_ID, builder=env_builder(make_sandbox_env), oracle=None, description="tests"
    )
    yield SANDBOX_ENV_ID
    _unregister(SANDBOX_ENV_ID)
