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
then Python on what it returned) scores 1 (:mod:`~vt_envs.domains.multi.oracle`).

The keywords and how the parts are built: :mod:`~vt_envs.domains.multi.config`.
"""

from __future__ import annotations

from vt_envs.domains.multi.config import EXAMPLES, INSTRUCTIONS, MULTI, MultiConfig
from vt_envs.domains.multi.oracle import (
    MultiFactsOnlyPolicy,
    MultiNoToolPolicy,
    MultiOracle,
    facts_only_shortcut,
)
from vt_envs.domains.multi.tasks import FAMILIES, multi_tasks
from vt_envs.tools.builder import domain_builder

__all__ = [
    "EXAMPLES",
    "FAMILIES",
    "INSTRUCTIONS",
    "MULTI",
    "MultiConfig",
    "MultiFactsOnlyPolicy",
    "MultiNoToolPolicy",
    "MultiOracle",
    "facts_only_shortcut",
    "make_multi_env",
    "multi_tasks",
]

make_multi_env = domain_builder(MULTI, name="make_multi_env", module=__name__)
