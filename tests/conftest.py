"""Shared fixtures: small tools and task sources for testing the env core."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vt_envs.core.task import Task, TaskList
from vt_envs.core.tool import Tool, ToolResult

SANDBOX_ENV_ID = "VTTest/Sandbox-v0"


class EchoTool(Tool):
    """Echoes its text; fails on ``"fail"``, raises on ``"raise"``.

    ``"sleep N"`` sleeps N seconds ignoring its deadline (so only the env's
    backstop stops it); ``"nap N"`` sleeps too but honours the deadline and
    returns its own timeout result, as a well-behaved tool does.
    """

    grace_s = 0.3  # keeps backstop tests quick

    name = "echo"
    description = "Echo TEXT back."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    tag_argument = "text"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.opened: list[Any] = []
        self.closed: list[Any] = []

    async def open_session(self, task: Any, *, seed: int = 0) -> dict[str, Any]:
        session = {"task": task.id, "calls": 0, "seed": seed}
        self.opened.append(session)
        return session

    async def close_session(self, session: Any) -> None:
        self.closed.append(session)

    async def call(
        self, session: Any, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        text = arguments["text"]
        session["calls"] += 1
        if text == "fail":
            return ToolResult.failure("Error: asked to fail.", "asked")
        if text == "raise":
            raise RuntimeError("tool bug")
        if text.startswith("sleep "):
            await asyncio.sleep(float(text.split()[1]))
        if text.startswith("nap "):
            wanted, limit = float(text.split()[1]), timeout_s or self.timeout_s
            await asyncio.sleep(min(wanted, limit))
            if wanted > limit:
                return ToolResult.failure(f"Error: timed out after {limit:g} s.", "timeout")
        return ToolResult(text)


def make_tasks(n: int = 5, split: str = "train") -> TaskList:
    return TaskList(
        [Task(id=f"t{i}", prompt=f"Say {i * 7}.", gold=str(i * 7)) for i in range(n)],
        name="echo",
        split=split,
    )


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


@pytest.fixture(scope="session")
def sandbox_env_id():
    """Registers ``VTTest/Sandbox-v0`` (python + bash) for the test session only."""
    import gymnasium as gym

    from vt_envs import env_builder, register_env
    from vt_envs import registration as vt_registration

    register_env(
        SANDBOX_ENV_ID, builder=env_builder(make_sandbox_env), oracle=None, description="tests"
    )
    yield SANDBOX_ENV_ID
    vt_registration._REGISTRY.pop(SANDBOX_ENV_ID, None)
    gym.envs.registry.pop(SANDBOX_ENV_ID, None)
