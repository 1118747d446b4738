"""VT-SWE-v0: fix a bug in a Python repository with bash and an editor; hidden tests grade it.

- :mod:`~vt_envs.domains.swe.config`: the declared domain (:class:`SWEConfig`, its
  keywords; :data:`SWE`, how its parts are built) and :mod:`~vt_envs.domains.swe.env`:
  the episode (:func:`make_swe_env`, registered as ``VT-SWE-v0``);
  :mod:`~vt_envs.domains.swe.tools`: ``bash`` and ``editor`` over one
  working copy per episode (:mod:`~vt_envs.domains.swe.workspace`,
  :mod:`~vt_envs.domains.swe.editor`, :mod:`~vt_envs.domains.swe.files`);
- the reward: :mod:`~vt_envs.domains.swe.verifier` and
  :mod:`~vt_envs.domains.swe.evaluation` (hidden tests in a fresh sandbox);
- tasks: SWE-smith-style mutants (:mod:`~vt_envs.domains.swe.mutations`,
  :mod:`~vt_envs.domains.swe.test_runs`, :mod:`~vt_envs.domains.swe.mutants`),
  materialized and cached (:mod:`~vt_envs.domains.swe.tasks`,
  :mod:`~vt_envs.domains.swe.sources`; :mod:`~vt_envs.domains.swe.fetch` gets a
  package's sdist; :mod:`~vt_envs.domains.swe.default_repos` pins the default
  repositories, ``gym.make("VT-SWE-v0", repos=[...])``), HumanEval
  (:mod:`~vt_envs.domains.swe.humaneval`) and
  SWE-bench-format instances (:mod:`~vt_envs.domains.swe.swebench`:
  ``from vt_envs.domains.swe import load_swebench``);
- :mod:`~vt_envs.domains.swe.oracle`: the reverting oracle and a do-nothing baseline.
"""

from vt_envs.domains.swe.default_repos import (
    DEFAULT_REPO_NAMES,
    DEFAULT_REPOS,
    RepositoryUnavailableError,
)
from vt_envs.domains.swe.env import make_swe_env
from vt_envs.domains.swe.oracle import DoNothingPolicy, SWEOracle
from vt_envs.domains.swe.swebench import (
    REQUIRED_FIELDS,
    UnsupportedTestIdError,
    check_test_id,
    load_swebench,
)

__all__ = [
    "DEFAULT_REPOS",
    "DEFAULT_REPO_NAMES",
    "REQUIRED_FIELDS",
    "DoNothingPolicy",
    "RepositoryUnavailableError",
    "SWEOracle",
    "UnsupportedTestIdError",
    "check_test_id",
    "load_swebench",
    "make_swe_env",
]
