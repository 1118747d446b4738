"""The VT-SWE-v0 episode: an issue, a working copy, ``bash`` + ``editor``, hidden tests.

:func:`make_swe_env` is the builder of the declared domain
:data:`~vt_envs.domains.swe.config.SWE` (its keywords: :class:`SWEConfig`): a
:class:`~vt_envs.core.env.ToolEnv` from a task source whose tasks carry, in
``assets``: ``repo`` (the repository the agent's copy is made from — without the
hidden tests), ``pristine`` (the repository with them), ``fail_to_pass`` /
``pass_to_pass`` (test ids) and ``test_files``. The prompt is the task's issue text
followed by the repository's layout. The agent ends the episode with
``<submit>…</submit>`` (a one-line summary of its change), which runs the hidden
tests. What the sandboxes see of the host, and which places holding answers are
hidden in them: :mod:`~vt_envs.domains.swe.config`.
"""

from __future__ import annotations

from vt_envs.domains.swe.config import (
    INSTRUCTIONS,
    SWE,
    SWEConfig,
    answer_paths,
    copies_on_path,
    default_tasks,
)
from vt_envs.domains.swe.workspace import with_layout
from vt_envs.tools.builder import domain_builder

__all__ = [
    "INSTRUCTIONS",
    "SWE",
    "SWEConfig",
    "answer_paths",
    "copies_on_path",
    "default_tasks",
    "make_swe_env",
    "with_layout",
]

make_swe_env = domain_builder(SWE, name="make_swe_env", module=__name__)
