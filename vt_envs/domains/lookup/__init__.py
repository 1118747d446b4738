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

from vt_envs.domains.lookup.config import EXAMPLES, INSTRUCTIONS, LOOKUP, LookupConfig
from vt_envs.domains.lookup.oracle import LookupOracle
from vt_envs.domains.lookup.tasks import lookup_tasks
from vt_envs.domains.lookup.tools import LookupTool
from vt_envs.tools.builder import domain_builder

__all__ = [
    "EXAMPLES",
    "INSTRUCTIONS",
    "LOOKUP",
    "LookupConfig",
    "LookupOracle",
    "LookupTool",
    "lookup_tasks",
    "make_lookup_env",
]

make_lookup_env = domain_builder(LOOKUP, name="make_lookup_env", module=__name__)
