"""VT-Math-v0 declared: its keywords (:class:`MathConfig`) and how its parts are built."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vt_envs.core.domain import Domain
from vt_envs.core.examples import ExampleCall, WorkedExample
from vt_envs.core.loaders import FieldMap
from vt_envs.core.task import TaskSource
from vt_envs.core.tool import Tool
from vt_envs.domains.math.generator import DIFFICULTIES
from vt_envs.domains.math.tasks import check_dataset, math_task_source
from vt_envs.domains.math.tools import python_tool
from vt_envs.domains.math.verifier import MathVerifier

__all__ = ["EXAMPLES", "INSTRUCTIONS", "MATH", "TORL_INLINE_TEMPLATE", "MathConfig"]

INSTRUCTIONS = (
    "Solve the math problem. You can run Python code to compute exact values; the "
    "interpreter keeps variables between calls, and its output is shown to you. "
    "Give the final answer as an exact value (an integer, a reduced fraction a/b, or a "
    "simplified expression), without units."
)
TORL_INLINE_TEMPLATE = "\n```output\n{text}\n```\n"

EXAMPLES = (
    WorkedExample(
        "What is 37 × 48 + 5?",
        (ExampleCall("python", {"code": "print(37 * 48 + 5)"}, "1781"),),
        "1781",
    ),
    WorkedExample(
        "What is the remainder when 2^{100} is divided by 7?",
        (ExampleCall("python", {"code": "print(pow(2, 100, 7))"}, "2"),),
        "2",
    ),
)
"""Two demonstrations: compute in Python, then answer what it printed."""


@dataclass(frozen=True)
class MathConfig:
    """VT-Math-v0's own keywords.

    Args:
        split: ``"train"`` or ``"test"`` (held out: no prompt appears in both,
            for the embedded generator and for user data alike).
        dataset: ``None`` (embedded generator), a JSONL/JSON/Parquet path
            (GSM8K, MATH/MATH500, AIME/AMC, DeepMath, ToRL/verl), ``"champ"``,
            or any :class:`TaskSource`.
        dataset_layout, fields, limit: how to read ``dataset`` (see
            :func:`load_math_dataset`; a directory of one-problem JSON files
            is the MATH release's tree).
        holdout, holdout_seed: how ``split`` splits user data with no split of
            its own: the test split is a seeded-hash ``holdout`` fraction of it
            (default 0.1); ``holdout=1.0`` takes a benchmark file whole as
            ``split="test"``. Data with a ``split`` field (or ``train/``/``test/``
            directories) keeps its own. Never a mere label: an empty split is refused.
        size, families, difficulty: the embedded generator's size, problem
            families (:data:`FAMILIES`) and levels (1 easy … 3 hard).
        traceback: ``"last_line"`` (ToRL: only the final error line) or ``"full"``.
        max_output_chars: cap on one call's output before tokenization; the
            env then cuts it to ``max_observation_tokens`` tokens.
        python_timeout_s: wall-clock limit of one call; past it the interpreter is
            killed and restarted (its state lost, and the agent told).
        isolation: the sandbox layer: ``None``/``"auto"`` (the best that works here),
            ``"bwrap"``, ``"unshare"`` or ``"none-i-understand-this-is-unsafe"``.
        python_mode: ``"persistent"`` (one namespace per episode) or ``"fork"``
            (fresh state per call, forked from a warm interpreter).
        prestart: sandboxes kept started and waiting, so an episode's sandbox is a
            hand-over; 0: each episode's sandbox starts on demand.
        lazy_start: start an episode's sandbox at its first Python call (an
            episode that answers at once costs none); ``False``: at reset.
        recycle: the next episode reuses the sandbox, recycled as fresh (every
            process killed, the work dir emptied, a new interpreter forked from
            a parent that never ran model code); ``False``: a new sandbox each.
        observation_format: ``"inline"`` (ToRL, default) or ``"chat"``.
        action_format: how the prompt describes tool calls; default ``"tags"``
            for inline, ``"json"`` for chat (both are always parsed).
        max_tool_calls: after this many calls the env says so and accepts
            only an answer.
        boxed_answers: accept ``\\boxed{}`` as the answer (besides ``<answer>``).
        verify_timeout_s: deadline of one math-verify comparison.
        examples: worked examples before the task (``None``: :data:`EXAMPLES`;
            ``[]`` for none; see :mod:`vt_envs.core.examples`).

    The tools are an interpreter (:class:`vt_envs.tools.python.PythonTool`);
    ``max_tool_calls`` and ``boxed_answers`` are episode defaults of this id, and
    other :class:`ToolEnv` keywords (``tokenizer``, ``rewards``,
    ``max_episode_tokens``, ``render_mode``, ...) pass through.
    """

    split: str = "train"
    dataset: str | os.PathLike[str] | TaskSource | None = None
    dataset_layout: str | None = None
    fields: FieldMap | None = None
    limit: int | None = None
    holdout: float | None = None
    holdout_seed: int = 0
    size: int | None = None
    families: Sequence[str] | None = None
    difficulty: Sequence[int] | int = DIFFICULTIES
    observation_format: str = "inline"
    action_format: str | None = None
    traceback: str = "last_line"
    max_output_chars: int = 4000
    python_timeout_s: float = 10.0
    isolation: str | None = None
    python_mode: str = "persistent"
    prestart: int = 0
    lazy_start: bool = True
    recycle: bool = True
    verify_timeout_s: float = 5.0
    examples: Any = None

    def __post_init__(self) -> None:
        check_dataset(self.dataset, self.holdout)


def tools(config: MathConfig) -> list[Tool]:
    """The ``python`` interpreter."""
    return [
        python_tool(
            timeout_s=config.python_timeout_s,
            isolation=config.isolation,
            mode=config.python_mode,
            traceback=config.traceback,
            max_output_chars=config.max_output_chars,
            prestart=config.prestart,
            lazy_start=config.lazy_start,
            recycle=config.recycle,
        )
    ]


def tasks(config: MathConfig) -> TaskSource:
    """The embedded generator's problems, a user's dataset, or a given ``TaskSource``."""
    return math_task_source(
        config.dataset,
        split=config.split,
        size=config.size,
        families=config.families,
        difficulty=config.difficulty,
        dataset_layout=config.dataset_layout,
        fields=config.fields,
        limit=config.limit,
        holdout=config.holdout,
        holdout_seed=config.holdout_seed,
    )


def verifier(config: MathConfig) -> MathVerifier:
    """Math-verify equivalence, each comparison within ``verify_timeout_s``."""
    return MathVerifier(timeout_s=config.verify_timeout_s)


def env_kwargs(config: MathConfig) -> dict[str, Any]:
    """The formats (``action_format`` follows ``observation_format`` unless given)
    and the worked examples (the math ones unless the user gives others)."""
    action_format = config.action_format
    if action_format is None:
        action_format = "tags" if config.observation_format == "inline" else "json"
    return {
        "observation_format": config.observation_format,
        "action_format": action_format,
        "examples": EXAMPLES if config.examples is None else config.examples,
    }


MATH: Domain[MathConfig] = Domain(
    id="VT-Math-v0",
    config=MathConfig,
    tools=tools,
    tasks=tasks,
    verifier=verifier,
    instructions=INSTRUCTIONS,
    episode={
        "inline_template": TORL_INLINE_TEMPLATE,
        "max_turns": 8,
        "max_tool_calls": 4,
        "max_observation_tokens": 512,
        "boxed_answers": True,
    },
    env_kwargs=env_kwargs,
)
