"""A domain declared as data (:class:`vt_envs.core.domain.Domain`): a user's declaration
registers and builds through ``gym.make`` with its keywords merged and checked once,
a tool server builds only its tools and tasks, and every VT id is declared."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import gymnasium as gym
import pytest

import vt_envs
from vt_envs import ExactMatch, Task, TaskList
from vt_envs.core.domain import Domain, Toolset
from vt_envs.domains.lookup import LookupTool
from vt_envs.errors import InvalidConfigError, UnknownKwargError
from vt_envs.registration import builder_of
from vt_envs.server.app import ToolServer
from vt_envs.server.config import ServerConfig
from vt_envs.tools.builder import domain_builder

ENV_ID = "VTTest/Declared-v0"
VERIFIERS_BUILT: list[str] = []


@dataclass(frozen=True)
class KeysConfig:
    """The test domain's keywords.

    Args:
        split: which tasks.
        size: how many tasks.
        delay_s: latency of each lookup.
    """

    split: str = "test"
    size: int = 3
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise InvalidConfigError(f"size must be >= 1, got {self.size}")


def _tasks(config: KeysConfig) -> TaskList:
    tasks = [
        Task(f"k{i}", f"What is the value of key {i:03d}?", f"{i * 7:03d}",
             metadata={"key": f"{i:03d}"}, assets={"table": {f"{i:03d}": f"{i * 7:03d}"}})
        for i in range(config.size)
    ]  # fmt: skip
    return TaskList(tasks, name="keys", split=config.split)


def _verifier(config: KeysConfig) -> ExactMatch:
    VERIFIERS_BUILT.append(config.split)
    return ExactMatch()


DECLARED = Domain(
    id=ENV_ID,
    config=KeysConfig,
    tools=lambda config: [LookupTool(delay_s=config.delay_s)],
    tasks=_tasks,
    verifier=_verifier,
    instructions="Find the value stored under the key.",
    episode={"max_turns": 3, "remind_turns_left": True},
)


@pytest.fixture
def env_id(register_temporary):
    register_temporary(
        ENV_ID,
        builder=domain_builder(DECLARED, name="make_keys_env"),
        oracle="vt_envs.domains.lookup:LookupOracle",
    )
    VERIFIERS_BUILT.clear()
    return ENV_ID


def test_a_declared_domain_plays_through_gym_make_with_its_defaults(env_id):
    env = gym.make(env_id)
    core = env.unwrapped
    assert core.max_turns == 3 and core.remind_turns_left is True  # the episode defaults
    assert sorted(core.tools) == ["lookup"] and core.name == ENV_ID
    obs, info = env.reset(seed=0)
    key = f"{int(info['task_id'][1:]):03d}"  # task k<i> asks for key <i>
    obs, _, _, _, _ = env.step(f"<lookup>{key}</lookup>")
    value = f"{int(key) * 7:03d}"
    assert value in obs["text"]  # the tool answered from the task's table
    _, reward, terminated, _, _ = env.step(f"<answer>{value}</answer>")
    assert terminated and reward == 1.0
    env.close()
    assert vt_envs.make(env_id, max_turns=5, size=2).max_turns == 5  # the user's keyword wins


def test_its_keywords_are_checked_once_by_name_type_and_the_configs_own_rule(env_id):
    with pytest.raises(UnknownKwargError, match="delay_s"):
        vt_envs.make(env_id, delay=0.1)
    with pytest.raises(InvalidConfigError, match="size"):
        vt_envs.make(env_id, size="3")  # wrong type, refused before the config is made
    with pytest.raises(InvalidConfigError, match="size must be >= 1"):
        vt_envs.make(env_id, size=0)
    with pytest.raises(InvalidConfigError, match="max_turns"):
        vt_envs.make(env_id, max_turns="3")  # an episode default is typed as ToolEnv's


def test_the_keyword_reference_reads_the_declaration(env_id):
    found = {k.name: k for k in vt_envs.keywords(env_id)}
    assert found["size"].default == 3 and found["size"].doc == "how many tasks."
    assert found["size"].annotation == "int" and found["size"].scope == "env"
    assert found["max_turns"].default == 3 and found["max_turns"].scope == "common"
    assert found["observation_format"].default == "chat"  # ToolEnv's own default


def test_a_tool_server_builds_only_the_tools_and_the_tasks(env_id):
    server = ToolServer(ServerConfig.build([env_id]), token="s3cret-for-tests")
    built = asyncio.run(server._build(env_id, {"split": "test"}))
    assert isinstance(built, Toolset)
    assert sorted(built.tools) == ["lookup"] and built.tasks.find("k1").gold == "007"
    assert VERIFIERS_BUILT == []  # no verifier, no env, no prompt was built
    vt_envs.make(env_id).close()
    assert VERIFIERS_BUILT == ["test"]  # (while a whole env builds one)
    asyncio.run(built.aclose())


def test_a_toolset_refuses_a_keyword_the_env_would(env_id):
    toolset = builder_of(env_id).toolset
    with pytest.raises(UnknownKwargError):
        toolset(sise=2)
    with pytest.raises(InvalidConfigError, match="tool server"):
        toolset(tool_server="http://127.0.0.1:9")
    assert sorted(toolset(extra_tools=["python"]).tools) == ["lookup", "python"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"config": dict}, "config must be a dataclass"),
        ({"episode": {"max_turnz": 3}}, "max_turnz"),
        ({"episode": {"tools": []}}, "tools"),
    ],
)
def test_a_malformed_declaration_is_refused_when_declared(change, message):
    fields = {**DECLARED.__dict__, **change}
    with pytest.raises(InvalidConfigError, match=message):
        Domain(**fields)


def test_every_vt_id_is_a_declared_domain():
    for env_id in vt_envs.registered_envs():
        build = builder_of(env_id)
        assert getattr(build, "domain", None) is not None, env_id
        assert build.domain.id == env_id


def test_a_toolset_refuses_an_extra_tool_that_takes_a_domain_tools_name(env_id):
    with pytest.raises(InvalidConfigError, match=r"already has the tools \['lookup'\]"):
        builder_of(env_id).toolset(extra_tools=[LookupTool()])
