"""VT-Lookup-v0 declared: its keywords (:class:`LookupConfig`) and how its parts are built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vt_envs.core.domain import Domain
from vt_envs.core.examples import ExampleCall, WorkedExample
from vt_envs.core.task import GeneratedTasks
from vt_envs.core.verifier import ExactMatch
from vt_envs.domains.lookup.tasks import lookup_tasks
from vt_envs.domains.lookup.tools import LookupTool

__all__ = ["EXAMPLES", "INSTRUCTIONS", "LOOKUP", "LookupConfig"]

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


@dataclass(frozen=True)
class LookupConfig:
    """VT-Lookup-v0's own keywords.

    Args:
        split: ``"train"`` (10,000 tasks) or ``"test"`` (500, drawn from another
            random stream: held-out tables and questions).
        num_keys: entries in each task's table (the tool reads it; the prompt does
            not show it).
        key_digits, value_digits: how many digits the keys and the values have.
        tool_delay_s: latency added to each lookup (tests, benchmarks).
        examples: worked examples before the task (``None``: :data:`EXAMPLES`;
            ``[]``: none).
    """

    split: str = "train"
    num_keys: int = 6
    key_digits: int = 3
    value_digits: int = 3
    tool_delay_s: float = 0.0
    examples: Any = None


def tools(config: LookupConfig) -> list[LookupTool]:
    """The ``lookup`` tool."""
    return [LookupTool(delay_s=config.tool_delay_s)]


def tasks(config: LookupConfig) -> GeneratedTasks:
    """The seeded tables of :func:`lookup_tasks`."""
    return lookup_tasks(
        config.split,
        num_keys=config.num_keys,
        key_digits=config.key_digits,
        value_digits=config.value_digits,
    )


def env_kwargs(config: LookupConfig) -> dict[str, Any]:
    """The worked examples (:data:`EXAMPLES` unless the user gives others)."""
    return {"examples": EXAMPLES if config.examples is None else config.examples}


LOOKUP: Domain[LookupConfig] = Domain(
    id="VT-Lookup-v0",
    config=LookupConfig,
    tools=tools,
    tasks=tasks,
    verifier=lambda config: ExactMatch(),
    instructions=INSTRUCTIONS,
    episode={
        "max_turns": 4,
        "observation_format": "chat",
        "inline_template": "<result>\n{text}\n</result>\n",
    },
    env_kwargs=env_kwargs,
)
