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

from vt_envs.domains.math.config import (
    EXAMPLES,
    INSTRUCTIONS,
    MATH,
    TORL_INLINE_TEMPLATE,
    MathConfig,
)
from vt_envs.domains.math.generator import DIFFICULTIES, FAMILIES
from vt_envs.domains.math.loaders import load_math_dataset
from vt_envs.domains.math.oracle import MathNoToolPolicy, MathOracle
from vt_envs.domains.math.tasks import math_tasks
from vt_envs.domains.math.verifier import MathVerifier
from vt_envs.tools.builder import domain_builder

__all__ = [
    "DIFFICULTIES",
    "EXAMPLES",
    "FAMILIES",
    "INSTRUCTIONS",
    "MATH",
    "TORL_INLINE_TEMPLATE",
    "MathConfig",
    "MathNoToolPolicy",
    "MathOracle",
    "MathVerifier",
    "load_math_dataset",
    "make_math_env",
    "math_tasks",
]

make_math_env = domain_builder(MATH, name="make_math_env", module=__name__)
