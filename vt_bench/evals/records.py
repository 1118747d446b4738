"""Per-rollout records and the crash-safe JSONL file that holds them.

One line of ``rollouts.jsonl`` per finished rollout, appended, flushed and
``fsync``-ed as the rollout finishes, so a run killed at any point keeps every
rollout that finished before it. A line cut off by the kill (the last one) is
ignored when the file is read back; ``--resume`` then runs only the
``(env_id, task_id, sample)`` keys that are missing or failed (``error`` set);
a replayed rollout's line comes later and wins.

A record (a JSON object)::

    env_id, task_id, sample, seed, policy    what ran (seed: the evaluation's)
    kind, task                                the task's kind or family (``None`` when
                                              its metadata names none; see
                                              ``runner.task_kind``) and its metadata
    rollout_index, reset_seed                 its place in the plan; the seed of its reset
    reward, correct, reward_parts             the outcome (correct: reward_parts
                                              ["outcome"] >= 1, the verifier's own)
    verifier_parts                            the verifier's itemization, if any
    terminated, truncated, truncation         how it ended
    turns: [{tokens_in, tokens_out, finish_reason, action}]
                                              per action: the ids the policy read
                                              new (the prompt, then each observation),
                                              the ids it wrote, why generation stopped
    tool_calls: [{turn, name, ok, error, latency_s}]
    invalid_actions                           actions that were neither a call nor an answer
    transcript                                the whole episode as text
    token_ids                                 every id in order (token-level policies)
    elapsed_s                                 wall time of the rollout
    error                                     the exception, when the rollout raised
                                              instead of ending (the endpoint, an engine
                                              or the env failed): not a score; ``None``
                                              otherwise
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["RecordFile", "record_key"]

Key = tuple[str, str, int]


def record_key(record: Mapping[str, Any]) -> Key:
    """``(env_id, task_id, sample)``: what identifies a rollout across runs."""
    return str(record["env_id"]), str(record["task_id"]), int(record["sample"])


class RecordFile:
    """``DIR/rollouts.jsonl``: append records one at a time, durably; read them back."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = None

    def read(self) -> list[dict[str, Any]]:
        """Every complete record; a torn last line is dropped, later duplicates win."""
        if not self.path.is_file():
            return []
        by_key: dict[Key, dict[str, Any]] = {}
        for record in _complete_lines(self.path):
            by_key[record_key(record)] = record
        return list(by_key.values())

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record and make it durable before returning."""
        if self._file is None:
            self._drop_torn_tail()
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _drop_torn_tail(self) -> None:
        """Cut a partial last line (a run killed mid-write) so the next append starts clean."""
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as f:
                f.truncate(end)


def _complete_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return  # torn by a kill mid-write
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
