"""VT-Multi-v0: tasks that need two different tools in one episode.

Every episode offers the same tools — ``sql`` (the ``shop`` DuckDB
database, sandboxed), ``search`` (the Wikipedia-summary knowledge base of
VT-Search-v0), ``crop`` and ``zoom`` (VT-Visual-v0's, on the task's image)
and ``python`` (the sandboxed interpreter) — under one parser and one system
prompt that describes them all. Each task needs a fact tool *and* Python: an
exact LCM or product (past DuckDB's 128-bit integers) over values only the
database holds, calendar arithmetic
over years only the corpus holds, or the product of two numbers printed too
small to read without zooming (:mod:`vt_envs.domains.multi.tasks`). Tasks
without an image have none (their observations' ``images`` are empty). The
reward is 1 when the integer answer equals the gold (:class:`~vt_envs.domains.math.MathVerifier`).

Baselines: :class:`MultiNoToolPolicy` answers at once;
:class:`MultiFactsOnlyPolicy` looks the facts up but computes without Python
(an approximate step: the largest price, a floating-point product, 365 days
a year, factors rounded to tens). Both score low; :class:`MultiOracle` (fact tool,
then Python on what it returned) scores 1.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vt_envs.core.env import ToolEnv
from vt_envs.core.examples import ExampleCall, WorkedExample
from vt_envs.core.policy import OraclePolicy, Policy
from vt_envs.core.task import Task
from vt_envs.domains.multi.tasks import FAMILIES, images_of_task, multi_tasks
from vt_envs.domains.visual.bbox import union_box
from vt_envs.domains.visual.oracle import ZOOM_MARGIN
from vt_envs.tools.builder import env_builder

__all__ = [
    "EXAMPLES",
    "FAMILIES",
    "INSTRUCTIONS",
    "MultiFactsOnlyPolicy",
    "MultiNoToolPolicy",
    "MultiOracle",
    "facts_only_shortcut",
    "make_multi_env",
    "multi_tasks",
]

INSTRUCTIONS = (
    "Answer the question. You will need two tools: one to find the facts (the shop "
    "database through SQL, the knowledge base through search, or a closer look at the "
    "image through crop or zoom) and the Python interpreter to compute with them. Give "
    "the final answer as an integer, without units. Each crop or zoom result is a new "
    'image, numbered in order (the task\'s image is image 0; refer to one with "image"). {bbox}'
)


_TOP_BOOKS = "SELECT price FROM products WHERE category = 'Books' ORDER BY price DESC LIMIT 3"
_PRODUCT_CODE = "import math\nprint(math.prod(round(p * 100) for p in [157.89, 155.99, 149.32]))"
_BY_STATUS = "SELECT status, COUNT(*) AS n FROM orders GROUP BY status ORDER BY n DESC"
EXAMPLES = (
    WorkedExample(
        "In the shop database, what is the product of the prices, in cents, of the three "
        "most expensive Books products?",
        (
            ExampleCall("sql", {"query": _TOP_BOOKS}, "price\n157.89\n155.99\n149.32\n(3 rows)"),
            ExampleCall(
                "python",
                {"code": _PRODUCT_CODE},
                "3677641267452",
            ),
        ),
        "3677641267452",
    ),
    WorkedExample(
        "In the shop database, count the orders of each status. What is the sum of the "
        "squares of these counts?",
        (
            ExampleCall(
                "sql",
                {"query": _BY_STATUS},
                "status | n\ndelivered | 1483\nreturned | 539\ncancelled | 496\nshipped | 482\n"
                "(4 rows)",
            ),
            ExampleCall(
                "python", {"code": "print(sum(n * n for n in [1483, 539, 496, 482]))"}, "2968150"
            ),
        ),
        "2968150",
    ),
)
"""Two demonstrations (facts from the shop database, then Python), of no task family's
question; ``tests/domains/multi`` runs their calls through the env's tools."""


@env_builder
def make_multi_env(
    *,
    split: str = "train",
    families: Sequence[str] = FAMILIES,
    size: int | None = None,
    retriever: str = "auto",
    top_k: int = 3,
    python_timeout_s: float = 10.0,
    sql_timeout_s: float = 5.0,
    isolation: str | None = None,
    max_turns: int = 6,
    max_tool_calls: int | None = 4,
    max_observation_tokens: int = 1024,
    examples: Any = None,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build VT-Multi-v0.

    Args:
        split: ``"train"`` (2,474 tasks) or ``"test"`` (282, held out); the
            families take equal turns (see :func:`multi_tasks`).
        families: task families (:data:`FAMILIES`): ``sql_lcm``,
            ``sql_product``, ``search_days``, ``crop_product``.
        size: at most this many tasks.
        retriever: the search tool's retriever: ``"auto"``, ``"dense"`` or
            ``"bm25"`` (as VT-Search-v0's).
        top_k: passages per search.
        python_timeout_s: deadline of one Python call (the interpreter restarts after it).
        sql_timeout_s: deadline of one SQL query.
        isolation: the sandbox layer of the Python and SQL tools (``None``: the best
            that works here; as VT-Math-v0's).
        examples: worked examples before the task (``None``: :data:`EXAMPLES`;
            ``[]``: none).
        max_turns, max_tool_calls, max_observation_tokens, **env_kwargs:
            passed to :class:`ToolEnv` (``processor=PATH`` for a Qwen2-VL
            processor's image tokens).
    """
    from vt_envs.domains.math.verifier import MathVerifier
    from vt_envs.domains.search import search_tasks, vital_articles_corpus
    from vt_envs.domains.search.retriever import shared_retriever
    from vt_envs.domains.search.tool import SearchTool
    from vt_envs.domains.sql.databases import database_path
    from vt_envs.domains.sql.tools import SQLTool
    from vt_envs.domains.visual.bbox import describe_format
    from vt_envs.domains.visual.tools import ImageStore
    from vt_envs.tools.python import PythonTool

    names = list(families)
    retrieval = shared_retriever(retriever, vital_articles_corpus(), index="flat")
    facts = (
        search_tasks(split, retriever=retrieval, top_k=top_k, kinds=("year_cloze",))
        if "search_days" in names
        else None
    )
    tasks = multi_tasks(
        split, search_tasks=facts, db_path=str(database_path("shop")), families=names, size=size
    )
    store = ImageStore(images_of_task)
    return ToolEnv(
        tools=[
            SQLTool(timeout_s=sql_timeout_s, isolation=isolation),
            SearchTool(retrieval, top_k=top_k),
            *store.tools(["crop", "zoom"], bbox_format="pixels"),
            PythonTool(timeout_s=python_timeout_s, isolation=isolation),
        ],
        tasks=tasks,
        verifier=MathVerifier(),
        instructions=INSTRUCTIONS.format(bbox=describe_format("pixels")),
        task_images=store.images,
        max_turns=max_turns,
        max_tool_calls=max_tool_calls,
        max_observation_tokens=max_observation_tokens,
        examples=EXAMPLES if examples is None else examples,
        name="VT-Multi-v0",
        **env_kwargs,
    )


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _fact_call(task: Task, step: int) -> str | None:
    """The oracle's (and the facts-only baseline's) fact-tool call number ``step``,
    or ``None`` once the facts are in: one query, two searches, or one zoom per tag."""
    oracle, family = task.assets["oracle"], task.metadata["family"]
    if family.startswith("sql"):
        return f"<sql>{oracle['query']}</sql>" if step == 0 else None
    if family == "search_days":
        return f"<search>{oracle['queries'][step]}</search>" if step < 2 else None
    if step >= len(oracle["targets"]):
        return None
    width, height = task.assets["image_size"]
    box = union_box([oracle["targets"][step]], width, height, ZOOM_MARGIN)
    call = {"name": "zoom", "arguments": {"bbox": list(box), "image": 0}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def _sql_values(content: str) -> list[str]:
    """The value lines of the SQL tool's result (header first, ``(n rows)`` last)."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    return [line for line in lines[1:] if not line.startswith("(")]


class MultiOracle(OraclePolicy):
    """Finds the facts with SQL or search, computes with Python, answers what it printed.

    SQL families: the oracle's query, then Python over the values the result
    shows (read from the observation). ``search_days``: one search per
    sentence; the years come from the task (privileged) only once both
    sentences' articles were retrieved (else it answers ``""``), then Python
    does the calendar arithmetic.
    """

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.seen: list[str] = []
        self.computed = False

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        task, family = self.task, self.task.metadata["family"]
        message = str((info.get("message") or {}).get("content", ""))
        if self.turn > 0:
            self.seen.append(message)
        call = _fact_call(task, self.turn)
        if call is not None:
            return call
        if not self.computed:  # the facts are in: compute with them once
            self.computed = True
            return f"<python>\n{self._code(family, task.assets['oracle'])}\n</python>"
        lines = [line for line in message.splitlines() if line.strip()]
        return f"<answer>{lines[-1].strip() if lines else ''}</answer>"

    def _code(self, family: str, oracle: Mapping[str, Any]) -> str:
        if family in ("sql_lcm", "sql_product"):  # the values the query's result showed
            values = ", ".join(_sql_values(self.seen[0]))
            return oracle["code"].replace("VALUES", f"[{values}]")
        if family == "crop_product":  # the numbers are read by looking: only if both zooms worked
            zoomed = sum("Image" in seen and "pixels" in seen for seen in self.seen) == 2
            a, b = oracle["numbers"] if zoomed else (0, 0)
            return oracle["code"].replace("A", str(a)).replace("B", str(b))
        found = all(title in "".join(self.seen) for title in oracle["gold_titles"])
        years = oracle["years"] if found else [0, 0]
        return oracle["code"].replace("YEARS", repr(list(years)))


class MultiNoToolPolicy(Policy):
    """The no-tool baseline: answers at once with the last number of the question."""

    def reset(self, task: Task) -> None:
        numbers = _NUMBER.findall(task.prompt)
        self.guess = numbers[-1] if numbers else "0"

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return f"<answer>{self.guess}</answer>"


class MultiFactsOnlyPolicy(OraclePolicy):
    """The one-tool baseline: the oracle's fact lookup, then an answer without Python.

    It computes the way a model (or SQL) without an interpreter might: the
    largest price for an LCM, a floating-point product, 365 days a year, a
    product of factors rounded to tens.
    """

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.seen: list[str] = []

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        family = self.task.metadata["family"]
        if self.turn > 0:
            self.seen.append(str((info.get("message") or {}).get("content", "")))
        call = _fact_call(self.task, self.turn)
        if call is not None:
            return call
        if family == "crop_product":  # rounds each factor to 10s, as a quick mental product
            a, b = self.task.assets["oracle"]["numbers"]
            return f"<answer>{round(a, -1) * round(b, -1)}</answer>"
        values = [float(v) for v in _sql_values(self.seen[0]) if _NUMBER.fullmatch(v)]
        if family == "sql_lcm":  # the largest price: the LCM's lower bound
            return f"<answer>{max((round(v * 100) for v in values), default=0)}</answer>"
        if family == "sql_product":  # a floating-point product, as SQL's own would be
            return f"<answer>{int(math.prod(v * 100 for v in values))}</answer>"
        years = self.task.assets["oracle"]["years"]
        return f"<answer>{365 * abs(years[0] - years[1])}</answer>"


def facts_only_shortcut(env: Any = None) -> MultiFactsOnlyPolicy:
    """Shortcut factory (the registration's): :class:`MultiFactsOnlyPolicy`."""
    return MultiFactsOnlyPolicy()
