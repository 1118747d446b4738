"""Scripted policies of VT-Search-v0: the oracle, and a no-search baseline.

:class:`SearchOracle` runs each hop's query from the task's privileged
assets and answers only if what it read supports the answer: every hop's
gold passage came back, and (for a second hop) the person to search for was
named in the first hop's passage. So a reward of 1.0 proves retrieval,
formatting, parsing and verification fit together. On tasks without oracle
queries (a user's ``dataset=``) it is a *reference policy*, not an oracle: it
searches the question and answers a gold only if a passage it read holds it
(else ``unknown``), so it never answers without searching.

:class:`NoSearchPolicy` answers at once from the question alone (the blanked
subject's most likely guess: a year, the most common nationality, or a
capitalized phrase of the question), the baseline a searching agent must beat.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vt_envs.core.policy import OraclePolicy, Policy
from vt_envs.core.task import Task
from vt_envs.domains.search.verifier import golds_of, normalize_answer

__all__ = ["NoSearchPolicy", "SearchOracle"]


class SearchOracle(OraclePolicy):
    """Searches with each hop's oracle query, then answers what the passages support."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.read: list[str] = []

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        queries = list(self.task.assets.get("oracle_queries", ()))
        if self.turn > 0:
            self.read.append(observation)
        if not queries:  # a user's question: search it, answer only from what came back
            queries = [self.task.prompt]
            if self.turn >= len(queries):
                read = f" {normalize_answer(' '.join(self.read))} "
                found = [g for g in golds_of(self.task.gold) if f" {normalize_answer(g)} " in read]
                return f"<answer>{found[0] if found else 'unknown'}</answer>"
        if self.turn < len(queries):
            if self.turn > 0 and queries[self.turn] not in self.read[-1]:
                return "<answer>unknown</answer>"  # the first hop did not name the bridge
            return f"<search>{queries[self.turn]}</search>"
        titles = self.task.assets.get("gold_titles", ())
        found = all(any(f"(Title: {t})" in seen for seen in self.read) for t in titles)
        return f"<answer>{golds_of(self.task.gold)[0] if found else 'unknown'}</answer>"


class NoSearchPolicy(Policy):
    """Answers immediately, guessing from the question text only."""

    def reset(self, task: Task) -> None:
        self.kind, self.question = task.metadata.get("kind"), task.prompt

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        if self.kind == "year_cloze":
            guess = "1900"
        elif self.kind == "two_hop":
            guess = "American"
        else:  # the last capitalized phrase of the quoted passage
            quoted = self.question.split('"')[1] if self.question.count('"') >= 2 else ""
            names = re.findall(r"(?:[A-Z][a-z]+ )*[A-Z][a-z]+", quoted)
            guess = names[-1] if names else "unknown"
        return f"<answer>{guess}</answer>"
