"""VT-Math-v0: math reasoning with a sandboxed, persistent Python interpreter.

The agent reasons, runs code with ``<python>CODE</python>`` (or a ``python``
JSON tool call ``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``;
both are always accepted), reads the output, and answers with
``<answer>…</answer>`` or ``\\boxed{…}``. The reward is 1 when the answer is
mathematically equivalent to the gold (:class:`MathVerifier`), else 0, plus
optional shaping (``rewards={"tool_error_penalty": 0.5}`` for ToRL's −0.5
per non-executable call, ``"missing_answer_penalty"``) in
``info["reward_parts"]``.

Observation format: ``"inline"`` by default (the ToRL recipe this env
reproduces: the output is appended inside the assistant turn as a
```` ```output ```` block, which base models such as Qwen2.5-Math continue
naturally); ``observation_format="chat"`` sends it as a tool message for
chat-tuned models, and then describes tools in the JSON-call format.

Tasks: the embedded seeded generator (:func:`math_tasks`) by default, or
``dataset=PATH`` for GSM8K / MATH / MATH500 / AIME / AMC / DeepMath / ToRL
files (:func:`load_math_dataset`), or ``dataset="champ"`` with the optional
``champ-dataset`` package.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from vt_envs.core.env import ToolEnv
from vt_envs.core.examples import ExampleCall, WorkedExample
from vt_envs.core.loaders import FieldMap
from vt_envs.core.task import TaskSource
from vt_envs.domains.math.generator import DIFFICULTIES, FAMILIES, math_tasks
from vt_envs.domains.math.loaders import DEFAULT_HOLDOUT, load_champ, load_math_dataset
from vt_envs.domains.math.oracle import MathNoToolPolicy, MathOracle
from vt_envs.domains.math.verifier import MathVerifier
from vt_envs.errors import InvalidConfigError
from vt_envs.tools.builder import env_builder

__all__ = [
    "DIFFICULTIES",
    "EXAMPLES",
    "FAMILIES",
    "INSTRUCTIONS",
    "MathNoToolPolicy",
    "MathOracle",
    "MathVerifier",
    "load_math_dataset",
    "make_math_env",
    "math_tasks",
]

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


def _task_source(
    dataset: str | os.PathLike[str] | TaskSource | None,
    *,
    split: str,
    size: int | None,
    families: Sequence[str] | None,
    difficulty: Sequence[int] | int,
    dataset_layout: str | None,
    fields: FieldMap | None,
    limit: int | None,
    holdout: float | None,
    holdout_seed: int,
) -> TaskSource:
    if holdout is not None and not isinstance(dataset, (str, os.PathLike)):
        raise InvalidConfigError(
            f"holdout={holdout!r} splits user data (dataset=PATH or 'champ'); the embedded "
            "generator and a TaskSource have their own splits: drop holdout"
        )
    kept = {"holdout": DEFAULT_HOLDOUT if holdout is None else holdout}
    if isinstance(dataset, TaskSource):
        return dataset
    if dataset is None:
        return math_tasks(split, size=size, families=families, difficulty=difficulty)
    if dataset == "champ":
        return load_champ(split=split, limit=limit, **kept)
    if isinstance(dataset, (str, os.PathLike)):
        return load_math_dataset(
            dataset,
            layout=dataset_layout,
            fields=fields,
            split=split,
            limit=limit,
            holdout_seed=holdout_seed,
            **kept,
        )
    raise InvalidConfigError(
        f"dataset must be None (the embedded generator), a file path, 'champ' or a "
        f"TaskSource, got {type(dataset).__name__}"
    )


@env_builder
def make_math_env(
    *,
    split: str = "train",
    dataset: str | os.PathLike[str] | TaskSource | None = None,
    dataset_layout: str | None = None,
    fields: FieldMap | None = None,
    limit: int | None = None,
    holdout: float | None = None,
    holdout_seed: int = 0,
    size: int | None = None,
    families: Sequence[str] | None = None,
    difficulty: Sequence[int] | int = DIFFICULTIES,
    observation_format: str = "inline",
    action_format: str | None = None,
    inline_template: str = TORL_INLINE_TEMPLATE,
    traceback: str = "last_line",
    max_output_chars: int = 4000,
    python_timeout_s: float = 10.0,
    isolation: str | None = None,
    python_mode: str = "persistent",
    prestart: int = 0,
    lazy_start: bool = True,
    recycle: bool = True,
    max_turns: int = 8,
    max_tool_calls: int | None = 4,
    max_observation_tokens: int = 512,
    boxed_answers: bool = True,
    verify_timeout_s: float = 5.0,
    examples: Any = None,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build VT-Math-v0.

    Tasks:
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

    Interpreter (:class:`vt_envs.tools.python.PythonTool`):
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

    Episode:
        observation_format: ``"inline"`` (ToRL, default) or ``"chat"``.
        action_format: how the prompt describes tool calls; default ``"tags"``
            for inline, ``"json"`` for chat (both are always parsed).
        max_tool_calls: after this many calls the env says so and accepts
            only an answer.
        boxed_answers: accept ``\\boxed{}`` as the answer (besides ``<answer>``).
        verify_timeout_s: deadline of one math-verify comparison.
        examples: worked examples before the task (``None``: :data:`EXAMPLES`;
            ``[]`` for none; see :mod:`vt_envs.core.examples`).

    Other :class:`ToolEnv` keywords (``tokenizer``, ``rewards``,
    ``max_episode_tokens``, ``render_mode``, ...) pass through.
    """
    from vt_envs.tools.python import PythonTool  # imported here: it resolves the sandbox

    tasks = _task_source(
        dataset,
        split=split,
        size=size,
        families=families,
        difficulty=difficulty,
        dataset_layout=dataset_layout,
        fields=fields,
        limit=limit,
        holdout=holdout,
        holdout_seed=holdout_seed,
    )
    tool = PythonTool(
        timeout_s=python_timeout_s,
        isolation=isolation,
        mode=python_mode,
        traceback=traceback,
        max_output_chars=max_output_chars,
        prestart=prestart,
        lazy_start=lazy_start,
        recycle=recycle,
    )
    if action_format is None:
        action_format = "tags" if observation_format == "inline" else "json"
    return ToolEnv(
        tools=[tool],
        tasks=tasks,
        verifier=MathVerifier(timeout_s=verify_timeout_s),
        instructions=INSTRUCTIONS,
        observation_format=observation_format,
        inline_template=inline_template,
        action_format=action_format,
        max_turns=max_turns,
        max_tool_calls=max_tool_calls,
        max_observation_tokens=max_observation_tokens,
        boxed_answers=boxed_answers,
        examples=EXAMPLES if examples is None else examples,
        name="VT-Math-v0",
        **env_kwargs,
    )
