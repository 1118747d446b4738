"""Question sets users bring to VT-Search-v0: Search-R1 / FlashRAG files and FanOutQA.

- :func:`load_search_r1` reads Search-R1's data (NQ, TriviaQA, PopQA,
  HotpotQA, 2Wiki, Musique, Bamboogle): FlashRAG records with ``question``
  and ``golden_answers`` (a list), or the verl-processed Parquet whose gold
  is ``reward_model.ground_truth.target`` and whose question is in the
  ``prompt`` after ``Question:``. JSONL, JSON or Parquet.
- :func:`load_fanoutqa` reads the questions of the PyPI package ``fanoutqa``
  from its data files (the package itself, which needs spaCy, is never
  imported), and :func:`fanoutqa_coverage` counts how many of them have
  their Wikipedia evidence in a corpus.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from vt_envs.core.loaders import read_records
from vt_envs.core.task import Task, TaskList
from vt_envs.domains.search.corpus import Corpus
from vt_envs.domains.search.verifier import golds_of
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = ["fanoutqa_coverage", "load_fanoutqa", "load_search_r1"]

_QUESTION_IN_PROMPT = re.compile(r"Question:\s*(.+?)\s*(?:\n|$)")


def _search_r1_question(record: Mapping[str, Any]) -> str:
    if record.get("question"):
        return str(record["question"]).strip()
    prompt = record.get("prompt")
    messages = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    for message in messages or ():
        match = _QUESTION_IN_PROMPT.search(str(message.get("content", "")))
        if match:
            return match.group(1)
    raise DatasetFormatError(
        f"a Search-R1 record needs 'question' (or a 'prompt' with 'Question: ...'); "
        f"it has {sorted(record)}"
    )


def _search_r1_golds(record: Mapping[str, Any]) -> list[str]:
    if "golden_answers" in record:
        raw = record["golden_answers"]
    else:
        try:
            raw = record["reward_model"]["ground_truth"]["target"]
        except (KeyError, TypeError):
            raise DatasetFormatError(
                "a Search-R1 record needs 'golden_answers' or "
                f"'reward_model.ground_truth.target'; it has {sorted(record)}"
            ) from None
    golds = [g for g in golds_of(raw) if g.strip()] if raw is not None else []
    if not golds:
        raise DatasetFormatError(f"a Search-R1 record has no non-empty gold answer: {raw!r}")
    return golds


def load_search_r1(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    split: str = "test",
    name: str | None = None,
    limit: int | None = None,
) -> TaskList:
    """Tasks from a Search-R1 / FlashRAG question file (see the module docstring)."""
    if isinstance(source, (str, os.PathLike)):
        records: Iterable[Mapping[str, Any]] = read_records(source)
        name = name or Path(source).stem
    else:
        records, name = source, name or "search-r1"
    tasks = []
    for i, record in enumerate(records):
        if limit is not None and i >= limit:
            break
        if not isinstance(record, Mapping):
            raise DatasetFormatError(
                f"{name}: record {i} is a {type(record).__name__}, not an object with "
                "'question' and 'golden_answers'"
            )
        source_name = str(record.get("data_source", name))
        tasks.append(
            Task(
                id=str(record.get("id", f"{name}/{split}/{i}")),
                prompt=_search_r1_question(record),
                gold=_search_r1_golds(record),
                metadata={"kind": "search_r1", "source": source_name},
            )
        )
    return TaskList(tasks, name=name, split=split)


def _fanoutqa_file(split: str) -> Path:
    if split not in ("dev", "test"):
        raise InvalidConfigError(f"FanOutQA splits are 'dev' and 'test', got {split!r}")
    spec = importlib.util.find_spec("fanoutqa")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidConfigError(
            "FanOutQA questions come from the PyPI package 'fanoutqa' "
            "(pip install --no-deps fanoutqa: only its data files are read)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / f"fanout-final-{split}.json"


def _evidence_titles(record: Mapping[str, Any]) -> list[str]:
    if "necessary_evidence" in record:  # the test split
        return [e["title"] for e in record["necessary_evidence"]]
    titles: list[str] = []
    stack = list(record.get("decomposition", ()))
    while stack:
        step = stack.pop()
        if step.get("evidence"):
            titles.append(step["evidence"]["title"])
        stack.extend(step.get("decomposition", ()))
    return titles


def _leaves(answer: Any) -> list[str]:
    if isinstance(answer, Mapping):
        return [leaf for value in answer.values() for leaf in _leaves(value)]
    if isinstance(answer, (list, tuple)):
        return [leaf for value in answer for leaf in _leaves(value)]
    return [str(answer)]


def load_fanoutqa(split: str = "dev", *, corpus: Corpus | None = None) -> TaskList:
    """FanOutQA questions with answers (the ``dev`` split; ``test`` has none).

    A scalar answer is the gold; a list or dict answer becomes one gold
    string of its values joined by ``", "`` (score those with ``metric="f1"``).
    With ``corpus``, only questions whose every evidence page is a passage
    title of the corpus are kept.
    """
    if split != "dev":
        raise InvalidConfigError("FanOutQA publishes answers for the 'dev' split only")
    records = json.loads(_fanoutqa_file(split).read_text(encoding="utf-8"))
    titles = {p.title for p in corpus} if corpus is not None else None
    tasks = []
    for record in records:
        evidence = _evidence_titles(record)
        if titles is not None and not (evidence and all(t in titles for t in evidence)):
            continue
        answer = record["answer"]
        scalar = not isinstance(answer, (Mapping, list, tuple))
        tasks.append(
            Task(
                id=f"fanoutqa/{split}/{record['id']}",
                prompt=record["question"],
                gold=[str(answer)] if scalar else [", ".join(_leaves(answer))],
                metadata={"kind": "fanoutqa", "answer_type": type(answer).__name__},
            )
        )
    if not tasks:
        raise InvalidConfigError(
            f"no FanOutQA {split} question has all its evidence in {corpus!r}; "
            "load them without corpus= (or bring a larger corpus)"
        )
    return TaskList(tasks, name="fanoutqa", split="test")


def fanoutqa_coverage(corpus: Corpus) -> dict[str, dict[str, int]]:
    """Per FanOutQA split: questions, those with all / any evidence page in ``corpus``,
    distinct evidence pages and how many of them the corpus has."""
    titles = {p.title for p in corpus}
    out = {}
    for split in ("dev", "test"):
        records = json.loads(_fanoutqa_file(split).read_text(encoding="utf-8"))
        evidence = [_evidence_titles(r) for r in records]
        pages = {t for e in evidence for t in e}
        out[split] = {
            "questions": len(records),
            "all_evidence_in_corpus": sum(
                bool(e) and all(t in titles for t in e) for e in evidence
            ),
            "any_evidence_in_corpus": sum(any(t in titles for t in e) for e in evidence),
            "evidence_pages": len(pages),
            "evidence_pages_in_corpus": len(pages & titles),
        }
    return out
