"""A verifier that declares ``reads_tools = True`` (it grades the state the episode's
tools changed) keeps its env's tools in-process: ``tool_server=`` is refused when the
env is built, and a tool server refuses to build it for a client."""

from __future__ import annotations

import asyncio

import pytest

import vt_envs
from vt_envs import ExactMatch, Task, TaskList, ToolEnv, env_builder
from vt_envs.domains.swe.verifier import HiddenTests
from vt_envs.errors import InvalidConfigError
from vt_envs.server.app import ToolServer
from vt_envs.server.config import Refused, ServerConfig

ENV_ID = "VTTest/ReadsTools-v0"


class _ReadsTools(ExactMatch):
    reads_tools = True


@env_builder
def _make(*, split: str = "test", **env_kwargs):
    tasks = TaskList([Task("t0", "Say hi.", "hi")], name="hi", split=split)
    return ToolEnv(tools=[], tasks=tasks, verifier=_ReadsTools(), instructions="Answer.",
                   name=ENV_ID, **env_kwargs)  # fmt: skip


@pytest.fixture
def env_id(register_temporary):
    register_temporary(ENV_ID, builder=_make)
    return ENV_ID


def test_the_declaration_is_read_from_the_verifier():
    assert HiddenTests.reads_tools and _ReadsTools().reads_tools
    assert not ExactMatch().reads_tools
    env = ToolEnv(tools=[], tasks=TaskList([Task("t0", "Say hi.", "hi")]), instructions="",
                  verifier=lambda task, answer: vt_envs.Score(1.0))  # fmt: skip
    assert not env.verifier.reads_tools  # a plain function reads no tools
    env.close()


def test_an_env_whose_verifier_reads_tools_refuses_a_tool_server(env_id):
    vt_envs.make(env_id).close()  # locally it builds
    with pytest.raises(InvalidConfigError, match="its verifier reads the state"):
        vt_envs.make(env_id, tool_server="http://127.0.0.1:9")


def test_a_tool_server_refuses_to_build_it(env_id):
    server = ToolServer(ServerConfig.build([env_id]), token="s3cret-for-tests")
    with pytest.raises(Refused) as info:
        asyncio.run(server._build(env_id, {}))
    assert info.value.status == 403 and "cannot be served remotely" in info.value.reason
