"""VT: async, text-based Gymnasium environments where LLM agents use tools.

``import vt_envs`` registers every ``VT-*`` id with Gymnasium::

    import gymnasium as gym
    import vt_envs

    env = gym.make("VT-Lookup-v0")
    obs, info = env.reset(seed=0)

``vt_envs`` imports without torch, vLLM or DeepSpeed.
"""

from vt_envs.checker import check
from vt_envs.core.domain import Domain
from vt_envs.core.env import RewardConfig, ToolEnv
from vt_envs.core.observation_encoder import ObservationEncoder
from vt_envs.core.parser import ActionParser, ParseResult, ToolCall
from vt_envs.core.policy import EpisodeResult, OraclePolicy, Policy, arun_episode, run_episode
from vt_envs.core.task import GeneratedTasks, Task, TaskList, TaskSource
from vt_envs.core.tokenizer import ChatTokenizer, load_tokenizer
from vt_envs.core.tool import Tool, ToolResult, tool_registry
from vt_envs.core.verifier import ExactMatch, Score, Verifier
from vt_envs.core.wrappers import aclose, areset, astep, bind_step_limits, stop_strings
from vt_envs.registration import (
    baseline_for,
    domain_builder,
    env_builder,
    make,
    make_mixture,
    make_vec,
    make_vec_mixture,
    oracle_for,
    register_env,
    registered_envs,
    shortcut_for,
)
from vt_envs.vector import ToolVectorEnv

__version__ = "0.1.0"

__all__ = [
    "ActionParser",
    "ChatTokenizer",
    "Domain",
    "EpisodeResult",
    "ExactMatch",
    "GeneratedTasks",
    "Keyword",
    "ObservationEncoder",
    "OraclePolicy",
    "ParseResult",
    "Policy",
    "RewardConfig",
    "Score",
    "Task",
    "TaskList",
    "TaskSource",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolResult",
    "ToolVectorEnv",
    "Verifier",
    "__version__",
    "aclose",
    "areset",
    "arun_episode",
    "astep",
    "baseline_for",
    "check",
    "domain_builder",
    "env_builder",
    "keywords",
    "load_tokenizer",
    "make",
    "make_mixture",
    "make_vec",
    "make_vec_mixture",
    "oracle_for",
    "register_env",
    "registered_envs",
    "run_episode",
    "shortcut_for",
    "stop_strings",
    "tool_registry",
]

bind_step_limits()


def __getattr__(name: str) -> object:
    # The keyword reference loads on first use, so `python -m vt_envs.keyword_reference`
    # runs a module the package has not imported already.
    if name in ("Keyword", "keywords"):
        from vt_envs import keyword_reference

        return getattr(keyword_reference, name)
    raise AttributeError(f"module 'vt_envs' has no attribute {name!r}")


register_env(
    "VT-Lookup-v0",
    builder="vt_envs.domains.lookup:make_lookup_env",
    oracle="vt_envs.domains.lookup:LookupOracle",
    description="sanity: call `lookup` with the key from the prompt, answer its value",
    client_kwargs=("split",),
)
register_env(
    "VT-Math-v0",
    builder="vt_envs.domains.math:make_math_env",
    oracle="vt_envs.domains.math:MathOracle",
    baseline="vt_envs.domains.math.oracle:MathNoToolPolicy",
    shortcuts={
        "product": "vt_envs.domains.math.oracle:product_shortcut",
        "largest": "vt_envs.domains.math.oracle:largest_shortcut",
        "sum": "vt_envs.domains.math.oracle:sum_shortcut",
    },
    description="math word/algebra problems with a sandboxed persistent Python interpreter",
    client_kwargs=("split", "families", "difficulty"),
)
register_env(
    "VT-Search-v0",
    builder="vt_envs.domains.search:make_search_env",
    oracle="vt_envs.domains.search:SearchOracle",
    baseline="vt_envs.domains.search.oracle:NoSearchPolicy",
    shortcuts={"no-search": "vt_envs.domains.search.shortcuts:no_search_shortcut"},
    description="retrieval QA: search an embedded FAISS (or BM25) index of Wikipedia, EM reward",
    client_kwargs=("split", "kinds"),
)
register_env(
    "VT-Visual-v0",
    builder="vt_envs.domains.visual:make_visual_env",
    oracle="vt_envs.domains.visual:VisualOracle",
    baseline="vt_envs.domains.visual:NoToolPolicy",
    shortcuts={"options-only": "vt_envs.domains.visual.shortcuts:options_only_shortcut"},
    description="visual QA on large scenes with small targets: crop/zoom tools, images by index",
    client_kwargs=("split", "kinds", "multiple_choice", "bbox_format"),
)
register_env(
    "VT-SWE-v0",
    builder="vt_envs.domains.swe.env:make_swe_env",
    oracle="vt_envs.domains.swe.oracle:SWEOracle",
    baseline="vt_envs.domains.swe.oracle:DoNothingPolicy",
    description="fix a bug in a repository with bash and an editor; hidden tests are the reward",
    remote_tools=False,  # the hidden tests grade the working copy its tools changed
)
register_env(
    "VT-SQL-v0",
    builder="vt_envs.domains.sql:make_sql_env",
    oracle="vt_envs.domains.sql:SQLOracle",
    shortcuts={
        "most-common": "vt_envs.domains.sql.shortcuts:most_common_shortcut",
        "empty-query": "vt_envs.domains.sql.shortcuts:empty_query_shortcut",
    },
    description="text-to-SQL on read-only DuckDB databases, execution-match reward",
    client_kwargs=("split", "databases"),
)
register_env(
    "VT-Multi-v0",
    builder="vt_envs.domains.multi:make_multi_env",
    oracle="vt_envs.domains.multi:MultiOracle",
    baseline="vt_envs.domains.multi:MultiNoToolPolicy",
    shortcuts={"facts-only": "vt_envs.domains.multi:facts_only_shortcut"},
    description="two tools per task: SQL or search for the facts, then Python to compute",
    client_kwargs=("split", "families"),
)
