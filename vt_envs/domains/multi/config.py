"""VT-Multi-v0 declared: its keywords (:class:`MultiConfig`) and how its parts are built.

Every part comes from another domain: ``sql`` (VT-SQL-v0's, on the ``shop``
database), ``search`` (VT-Search-v0's), ``crop`` and ``zoom`` (VT-Visual-v0's) and
``python``; the verifier is VT-Math-v0's. The SQL, search, math and Python modules
are imported only when a part is built.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vt_envs.core.domain import Domain
from vt_envs.core.examples import ExampleCall, WorkedExample
from vt_envs.core.task import TaskSource
from vt_envs.core.tool import Tool
from vt_envs.core.verifier import Verifier
from vt_envs.domains.multi.tasks import FAMILIES, images_of_task, multi_tasks
from vt_envs.domains.visual.bbox import describe_format
from vt_envs.domains.visual.tools import ImageStore

if TYPE_CHECKING:
    from vt_envs.domains.search.retriever import Retriever

__all__ = ["EXAMPLES", "INSTRUCTIONS", "MULTI", "MultiConfig"]

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


@dataclass(frozen=True)
class MultiConfig:
    """VT-Multi-v0's own keywords.

    ``processor=PATH`` (a Qwen2-VL processor's image tokens) is :class:`ToolEnv`'s.

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
    """

    split: str = "train"
    families: Sequence[str] = FAMILIES
    size: int | None = None
    retriever: str = "auto"
    top_k: int = 3
    python_timeout_s: float = 10.0
    sql_timeout_s: float = 5.0
    isolation: str | None = None
    examples: Any = None

    @functools.cached_property
    def retrieval(self) -> Retriever:
        """The process-wide retriever of ``retriever=`` over the Wikipedia summaries
        (resolved once per config, so the tools and the tasks share it)."""
        from vt_envs.domains.search import vital_articles_corpus
        from vt_envs.domains.search.retriever import shared_retriever

        return shared_retriever(self.retriever, vital_articles_corpus(), index="flat")

    @functools.cached_property
    def image_store(self) -> ImageStore:
        """The one :class:`ImageStore` of the env built from these keywords (once per
        config): its ``crop`` and ``zoom`` tools and its ``task_images`` share it."""
        return ImageStore(images_of_task)


def tools(config: MultiConfig) -> list[Tool]:
    """``sql``, ``search``, ``crop``, ``zoom`` and ``python``, for every task."""
    from vt_envs.domains.search.tools import SearchTool
    from vt_envs.domains.sql.tools import SQLTool
    from vt_envs.tools.python import PythonTool

    retrieval = config.retrieval
    return [
        SQLTool(timeout_s=config.sql_timeout_s, isolation=config.isolation),
        SearchTool(retrieval, top_k=config.top_k),
        *config.image_store.tools(["crop", "zoom"], bbox_format="pixels"),
        PythonTool(timeout_s=config.python_timeout_s, isolation=config.isolation),
    ]


def tasks(config: MultiConfig) -> TaskSource:
    """The families' tasks (:func:`multi_tasks`); ``search_days`` pairs VT-Search-v0's
    ``year_cloze`` tasks."""
    from vt_envs.domains.search import search_tasks
    from vt_envs.domains.sql.databases import database_path

    names = list(config.families)
    facts = (
        search_tasks(
            config.split, retriever=config.retrieval, top_k=config.top_k, kinds=("year_cloze",)
        )
        if "search_days" in names
        else None
    )
    return multi_tasks(
        config.split,
        search_tasks=facts,
        db_path=str(database_path("shop")),
        families=names,
        size=config.size,
    )


def verifier(config: MultiConfig) -> Verifier:
    """VT-Math-v0's: the integer answer against the gold."""
    from vt_envs.domains.math.verifier import MathVerifier

    return MathVerifier()


def env_kwargs(config: MultiConfig) -> dict[str, Any]:
    """The task images (through the image tools' store) and the worked examples
    (:data:`EXAMPLES` unless the user gives others)."""
    return {
        "task_images": config.image_store.images,
        "examples": EXAMPLES if config.examples is None else config.examples,
    }


MULTI: Domain[MultiConfig] = Domain(
    id="VT-Multi-v0",
    config=MultiConfig,
    tools=tools,
    tasks=tasks,
    verifier=verifier,
    instructions=INSTRUCTIONS.format(bbox=describe_format("pixels")),
    episode={"max_turns": 6, "max_tool_calls": 4, "max_observation_tokens": 1024},
    env_kwargs=env_kwargs,
)
