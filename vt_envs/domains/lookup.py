"""VT-Lookup-v0: the one-capability sanity env.

Each task hides a small table of keys → values behind a ``lookup`` tool. The
prompt names one key; the agent must call ``<lookup>KEY</lookup>``, read the
value, and answer ``<answer>VALUE</answer>``. Guessing succeeds with
probability ``10 ** -value_digits``, so reward comes from using the tool.

Keys and values are digit strings: the default tokenizer keeps every digit
as its own token, so copying them is easy for a tiny model. This is the
smallest env on which the trainer can show learning in minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vt_envs.core.env import ToolEnv
from vt_envs.core.examples import ExampleCall, WorkedExample
from vt_envs.core.policy import OraclePolicy
from vt_envs.core.task import GeneratedTasks, Task
from vt_envs.core.tool import Tool, ToolResult
from vt_envs.core.verifier import ExactMatch
from vt_envs.errors import InvalidConfigError
from vt_envs.tools.builder import env_builder

__all__ = ["EXAMPLES", "LookupOracle", "LookupTool", "lookup_tasks", "make_lookup_env"]

INSTRUCTIONS = "Find the value stored under the key in the question."

EXAMPLES = (
    WorkedExample(
        "What is the value of key 123?", (ExampleCall("lookup", {"key": "123"}, "456"),), "456"
    ),
    WorkedExample(
        "What is the value of key 908?", (ExampleCall("lookup", {"key": "908"}, "031"),), "031"
    ),
)
"""Two demonstrations (each episode's table is its own, so they give nothing away)."""
_SPLIT_STREAM = {"train": 0, "test": 1}


class LookupTool(Tool):
    """Returns the value stored under a key in the episode's hidden table."""

    name = "lookup"
    description = "Return the value stored under KEY."
    parameters = {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    }
    tag_argument = "key"

    def __init__(self, *, timeout_s: float = 5.0, delay_s: float = 0.0):
        super().__init__(timeout_s=timeout_s)
        self.delay_s = delay_s  # simulated latency, for scheduling tests and benchmarks

    concurrent_calls = True  # the table is read-only

    async def open_session(self, task: Any, *, seed: int = 0) -> Mapping[str, str]:
        return dict(task.assets["table"]) if task is not None else {}

    async def call(
        self,
        session: Mapping[str, str],
        arguments: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> ToolResult:
        if self.delay_s:
            import asyncio

            await asyncio.sleep(self.delay_s)
        key = arguments["key"].strip()
        if key in session:
            return ToolResult(session[key])
        return ToolResult.failure(f"No key {key!r}.", "not_found")


def lookup_tasks(
    split: str = "train",
    *,
    size: int | None = None,
    num_keys: int = 6,
    key_digits: int = 3,
    value_digits: int = 3,
) -> GeneratedTasks:
    """The seeded task source of VT-Lookup-v0 (train: 10,000 tasks; test: 500).

    Train and test draw from different random streams, so held-out tables
    and questions are new to a policy trained on the train split.
    """
    if split not in _SPLIT_STREAM:
        raise InvalidConfigError(f"split must be one of {list(_SPLIT_STREAM)}, got {split!r}")
    if num_keys > 10**key_digits:
        raise InvalidConfigError(
            f"num_keys={num_keys} distinct keys do not fit in {key_digits} digits"
        )

    def generate(split: str, index: int) -> Task:
        rng = np.random.default_rng([_SPLIT_STREAM[split], index, num_keys, key_digits])
        keys = rng.choice(10**key_digits, size=num_keys, replace=False)
        values = rng.integers(0, 10**value_digits, size=num_keys)
        table = {f"{k:0{key_digits}d}": f"{v:0{value_digits}d}" for k, v in zip(keys, values)}
        key = list(table)[int(rng.integers(num_keys))]
        return Task(
            id=f"lookup/{split}/{index}",
            prompt=f"What is the value of key {key}?",
            gold=table[key],
            metadata={"key": key},
            assets={"table": table},
        )

    default_size = 10_000 if split == "train" else 500
    return GeneratedTasks(generate, size or default_size, name="lookup", split=split)


class LookupOracle(OraclePolicy):
    """Looks the key up, then answers exactly what the tool returned."""

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        if self.turn == 0:
            return f"<lookup>{self.task.metadata['key']}</lookup>"
        return f"<answer>{info['message']['content'].strip()}</answer>"


@env_builder
def make_lookup_env(
    *,
    split: str = "train",
    num_keys: int = 6,
    key_digits: int = 3,
    value_digits: int = 3,
    tool_delay_s: float = 0.0,
    max_turns: int = 4,
    observation_format: str = "chat",
    inline_template: str = "<result>\n{text}\n</result>\n",
    examples: Any = None,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build VT-Lookup-v0: look the prompt's key up with the ``lookup`` tool, answer its value.

    Args:
        split: ``"train"`` (10,000 tasks) or ``"test"`` (500, drawn from another
            random stream: held-out tables and questions).
        num_keys: entries in each task's table (the tool reads it; the prompt does
            not show it).
        key_digits, value_digits: how many digits the keys and the values have.
        tool_delay_s: latency added to each lookup (tests, benchmarks).
        examples: worked examples before the task (``None``: :data:`EXAMPLES`;
            ``[]``: none).

    Other :class:`ToolEnv` keywords (``max_turns``, ``observation_format``, ...) pass
    through.
    """
    return ToolEnv(
        tools=[LookupTool(delay_s=tool_delay_s)],
        tasks=lookup_tasks(
            split, num_keys=num_keys, key_digits=key_digits, value_digits=value_digits
        ),
        verifier=ExactMatch(),
        instructions=INSTRUCTIONS,
        max_turns=max_turns,
        observation_format=observation_format,
        inline_template=inline_template,
        examples=EXAMPLES if examples is None else examples,
        name="VT-Lookup-v0",
        **env_kwargs,
    )
