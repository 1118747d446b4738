"""VT-SWE-v0's reward: the hidden tests on the agent's working copy after ``<submit>``.

1.0 when every FAIL_TO_PASS test now passes and every PASS_TO_PASS test
still passes; else 0. With ``partial_credit``, the fraction of FAIL_TO_PASS
tests fixed, and 0 if any PASS_TO_PASS test broke. ``Score.parts`` itemizes
it: ``fail_to_pass_fixed``, ``fail_to_pass_total``, ``pass_to_pass_broken``,
``timeout``, ``tampered`` (the run's canaries caught a rewrite of its outcomes: 0),
``canaries``, ``children``, ``incomplete``; the run happens in a fresh sandbox under its own
deadline (:func:`~vt_envs.domains.swe.evaluation.run_hidden_tests`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vt_envs.core.task import Task
from vt_envs.core.verifier import NO_TOOLS, EpisodeTools, Score, Verifier
from vt_envs.domains.swe.evaluation import DEFAULT_CHILDREN, run_hidden_tests
from vt_envs.domains.swe.files import PathError
from vt_envs.domains.swe.tools import WorkspaceStore
from vt_envs.sandbox.isolation import Isolation

__all__ = ["HiddenTests"]


class HiddenTests(Verifier):
    """Grades the episode's working copy (from ``store``) against the task's tests.

    Task assets used: ``pristine`` (the repository with the hidden tests),
    ``fail_to_pass``, ``pass_to_pass`` (test ids) and ``test_files`` (every
    test module those ids live in); ``hidden_files`` (the modules the agent never
    saw, where the canaries go; default: every test module).
    """

    reads_tools = True  # it grades the working copy the episode's bash and editor changed

    def __init__(
        self,
        store: WorkspaceStore,
        isolation: Isolation,
        *,
        partial_credit: bool = False,
        timeout_s: float = 120.0,
        children: int = DEFAULT_CHILDREN,
    ):
        self.store, self.isolation = store, isolation
        self.partial_credit, self.timeout_s, self.children = partial_credit, timeout_s, children

    async def averify(self, task: Task, answer: str, tools: EpisodeTools = NO_TOOLS) -> Score:
        workspace = self.store.current(task)
        if workspace is None:
            return Score(0.0, {"no_workspace": 1.0}, "the episode's working copy is gone")
        if workspace.spoiled:
            return Score(0.0, {"disk_quota": 1.0}, "the working copy passed its disk quota")
        assets = task.assets
        f2p, p2p = list(assets["fail_to_pass"]), list(assets["pass_to_pass"])
        try:
            outcome = await run_hidden_tests(
                workspace,
                pristine=Path(assets["pristine"]),
                test_ids=[*f2p, *p2p],
                test_files=list(assets["test_files"]),
                isolation=self.isolation,
                timeout_s=self.timeout_s,
                test_env=assets.get("test_env"),
                hidden_files=assets.get("hidden_files"),
                fail_to_pass=f2p,
                children=self.children,
            )
        except PathError as exc:  # the agent's tree cannot be read as it must
            return Score(0.0, {"error": 1.0}, f"the change could not be applied: {exc}")
        except Exception as exc:
            return Score(0.0, {"error": 1.0}, f"the evaluation failed: {type(exc).__name__}")
        fixed = sum(t in outcome.passed for t in f2p)
        broken = sum(t not in outcome.passed for t in p2p)
        parts = {
            "fail_to_pass_fixed": float(fixed),
            "fail_to_pass_total": float(len(f2p)),
            "pass_to_pass_broken": float(broken),
            "timeout": float(outcome.status == "timeout"),
            "tampered": float(outcome.status == "tampered"),
            "too_large": float(outcome.status == "too_large"),
            "ignored_files": float(len(outcome.ignored)),
            "canaries": float(outcome.canaries),
            "children": float(outcome.children),
            "incomplete": float(outcome.incomplete),
            "eval_s": outcome.elapsed_s,
        }
        if broken or outcome.status == "tampered":
            value = 0.0
        elif self.partial_credit:
            value = fixed / max(len(f2p), 1)
        else:
            value = float(fixed == len(f2p))
        detail = "" if value == 1.0 else f"{fixed}/{len(f2p)} fixed, {broken} broken"
        if outcome.reasons:
            detail = f"tampered: {'; '.join(outcome.reasons)}"
        return Score(value, parts, detail)

    def __call__(self, task: Task, answer: str) -> Any:  # pragma: no cover - async only
        raise TypeError("HiddenTests is asynchronous: the env awaits averify()")
