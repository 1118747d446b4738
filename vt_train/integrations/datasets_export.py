"""Evaluation / rollout records as a Hugging Face ``datasets.Dataset``, for TRL's ``SFTTrainer``.

:func:`records_to_dataset` reads the records of ``vt-bench eval --out DIR``
(``DIR/rollouts.jsonl`` or ``rollouts.jsonl.gz``, one JSON object per rollout; see
:mod:`vt_bench.evals.records`) and returns one row per rollout:

==================  ==========================================================================
``messages``        the episode as chat messages: the env's prompt (system prompt, worked
                    examples, the task), then each action (``assistant``) and each env
                    observation (``tool`` in the ``chat`` format). An assistant message that
                    calls tools also has ``tool_calls`` (``[{"type": "function", "function":
                    {"name", "arguments"}}]``, ``arguments`` a JSON string), and the tool
                    message after it the tool's ``name``: the chat-messages format of TRL and
                    ``transformers`` chat templates. ``content`` keeps the action's own text.
``input_ids``       the episode's token ids: the record's ``token_ids`` (the ids a token-level
                    policy generated and the env wrote, never re-tokenized) when it has them;
                    else (a text policy: an endpoint, the oracle) the env's own ids of the
                    episode: its observations' ids and its encoding of each action text
``assistant_masks`` 1 on the ids the policy wrote, 0 on the env's (prompt, observations):
                    ``SFTTrainer`` trains on those ids only
``ids_source``      ``"policy"`` (the record's ids) or ``"env"`` (the replay's)
``env_id``, ``task_id``, ``sample``, ``policy``, ``reward``, ``correct``: from the record
``replay_ok``       the replay gave the record's reward and token counts
==================  ==========================================================================

The messages come from replaying each episode through its env: ``gym.make(env_id)`` with
the evaluation's split, env kwargs and tokenizer (``DIR/config.json``), reset with the
record's task and reset seed, then stepped with each recorded action; every message is
the env's own (``info["messages"]``, ``info["message"]``), not a parse of the transcript.
A dataset with ``input_ids`` is taken by ``SFTTrainer`` as already tokenized: it trains on
these ids, with ``assistant_masks`` as the loss mask, and does not re-render
``messages`` (which are for reading, filtering and other trainers).

Not exported: records whose rollout raised (``error`` set), mixtures
(``mixture:...`` ids) and image envs (their messages hold images).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vt_envs.errors import InvalidConfigError

__all__ = ["RECORD_FILES", "episode_messages", "read_records", "records_to_dataset"]

#: The record files of an evaluation directory, in the order they are looked for.
RECORD_FILES = ("rollouts.jsonl", "rollouts.jsonl.gz")


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of an eval directory or a ``rollouts.jsonl[.gz]`` file: complete lines
    only (a run killed mid-write leaves a torn last line), a later record of the same
    ``(env_id, task_id, sample)`` winning (``--resume`` replays)."""
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in RECORD_FILES if (path / name).is_file()]
        if not found:
            raise InvalidConfigError(
                f"{path}: no {' or '.join(RECORD_FILES)} (vt-bench eval --out)"
            )
        path = found[0]
    if not path.is_file():
        raise InvalidConfigError(f"{path}: no such records file")
    opener = gzip.open if path.suffix == ".gz" else open
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn by a kill mid-write
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                key = (record.get("env_id"), record.get("task_id"), record.get("sample"))
                by_key[key] = record
    return list(by_key.values())


def _eval_config(path: Path) -> dict[str, Any]:
    config = (path if path.is_dir() else path.parent) / "config.json"
    return json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}


def _config_tokenizer(config: Mapping[str, Any]) -> Any:
    """The tokenizer the evaluation's envs used (as ``EvalConfig.env_tokenizer`` of
    :mod:`vt_bench.evals.runner` picks it): its ``tokenizer``, else an ``hf:`` / ``vllm:``
    policy's model, else the default."""
    if config.get("tokenizer"):
        return config["tokenizer"]
    kind, _, target = str(config.get("policy") or "").partition(":")
    return target if kind in ("hf", "vllm") and target else None


def _tool_calls(env: Any, text: str) -> list[dict[str, Any]] | None:
    parse = env.unwrapped.parser.parse(text)
    if parse.kind != "tool_call":
        return None
    return [
        {
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)},
        }
        for c in parse.calls
    ]


def _with_tool_calls(env: Any, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` in the chat-messages tool format: ``tool_calls`` on assistant messages
    that call tools, ``name`` on the tool messages that answer them."""
    out: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] | None = None
    for m in messages:
        m = {"role": m["role"], "content": m["content"], "tool_calls": None, "name": None}
        if not isinstance(m["content"], str):
            raise InvalidConfigError("messages with images are not exported")
        if m["role"] == "assistant":
            calls = m["tool_calls"] = _tool_calls(env, m["content"])
        elif m["role"] == "tool" and calls:
            m["name"] = calls[0]["function"]["name"]
        out.append(m)
    return out


def episode_messages(
    env: Any, record: Mapping[str, Any]
) -> tuple[list[dict], list[int], list[int], bool]:
    """Replay ``record`` in ``env``: ``(messages, ids, assistant_mask, matches)``, the ids and
    mask the env's (observations; each action's ids as the env encoded its text), ``matches``
    whether the replay gave the record's reward and token counts (of the observations; of
    the actions too for a record without ``token_ids``)."""
    tokenizer = env.unwrapped.tokenizer
    seed = record.get("reset_seed")
    obs, info = env.reset(seed=seed, options={"task_id": record["task_id"]})
    messages = [dict(m) for m in info["messages"]]
    ids, mask = [int(i) for i in obs["tokens"]], [0] * len(obs["tokens"])
    turns = list(record.get("turns") or [])
    matches = True
    reward, done = 0.0, False
    for turn in turns:
        if done:  # the record has more turns than the replayed episode
            matches = False
            break
        action = str(turn.get("action") or "")
        if turn.get("tokens_in") is not None and turn["tokens_in"] != len(obs["tokens"]):
            matches = False
        action_ids = tokenizer.encode(action)
        # (a token-level policy's own ids may not be the canonical encoding of its text)
        counted = turn.get("tokens_out") is not None and not record.get("token_ids")
        if counted and turn["tokens_out"] != len(action_ids):
            matches = False
        ids += action_ids
        mask += [1] * len(action_ids)
        messages.append({"role": "assistant", "content": action.removesuffix(tokenizer.eos_token)})
        obs, step_reward, terminated, truncated, info = env.step(action)
        reward += float(step_reward)
        done = bool(terminated or truncated)
        if not done:
            messages.append(dict(info["message"]))
            ids += [int(i) for i in obs["tokens"]]
            mask += [0] * len(obs["tokens"])
    if not done and record.get("truncation"):  # ended by the runner (its context budget)
        _, step_reward, *_ = env.unwrapped.truncate(str(record["truncation"]))
        reward += float(step_reward)
        done = True
    if record.get("reward") is not None and abs(reward - float(record["reward"])) > 1e-6:
        matches = False
    matches = matches and done
    return _with_tool_calls(env, messages), ids, mask, matches


def _policy_ids(record: Mapping[str, Any]) -> tuple[list[int], list[int]] | None:
    """The record's own ``token_ids`` and their assistant mask (from each turn's
    ``tokens_in`` / ``tokens_out``), or ``None`` when it has none or they do not add up."""
    token_ids = record.get("token_ids")
    if not token_ids:
        return None
    mask: list[int] = []
    for turn in record.get("turns") or []:
        if turn.get("tokens_in") is None or turn.get("tokens_out") is None:
            return None
        mask += [0] * int(turn["tokens_in"]) + [1] * int(turn["tokens_out"])
    if len(mask) != len(token_ids):
        return None
    return [int(i) for i in token_ids], mask


def records_to_dataset(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    env_ids: Sequence[str] | None = None,
    min_reward: float | None = None,
    tokenizer: Any = None,
    split: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Records (an eval directory, a ``rollouts.jsonl[.gz]`` file, or record dicts) as a
    ``datasets.Dataset`` (columns: see the module docstring).

    Args:
        env_ids: export only these envs' records (default: every env id in the records).
        min_reward: export only rollouts with at least this reward (rejection sampling).
        tokenizer / split / env_kwargs: how to make the envs the episodes are replayed in;
            default: the evaluation's ``config.json`` next to the records (its tokenizer or
            ``hf:`` model, ``split``, ``env_kwargs`` and ``env_kwargs_by_id``), else the
            env's defaults on the ``test`` split.
    """
    import datasets
    import gymnasium as gym

    config: dict[str, Any] = {}
    if isinstance(source, (str, os.PathLike)):
        config = _eval_config(Path(source))
        records = read_records(source)
    else:
        records = [dict(r) for r in source]
    if tokenizer is None:
        tokenizer = _config_tokenizer(config)
    split = split or config.get("split") or "test"
    wanted = set(env_ids) if env_ids is not None else None
    envs: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for record in records:
            env_id = str(record.get("env_id"))
            if wanted is not None and env_id not in wanted:
                continue
            if record.get("error"):
                continue
            if min_reward is not None and float(record.get("reward") or 0.0) < min_reward:
                continue
            if env_id.startswith("mixture:"):
                raise InvalidConfigError(
                    f"records of {env_id} are not exported (a mixture); pick its members' "
                    "records with env_ids"
                )
            env = envs.get(env_id)
            if env is None:
                kwargs = {
                    **dict(config.get("env_kwargs") or {}),
                    **dict((config.get("env_kwargs_by_id") or {}).get(env_id) or {}),
                    **dict(env_kwargs or {}),
                }
                env = envs[env_id] = gym.make(env_id, split=split, tokenizer=tokenizer, **kwargs)
            messages, ids, mask, matches = episode_messages(env, record)
            policy_ids = _policy_ids(record)
            if policy_ids is not None:
                ids, mask = policy_ids
            rows.append(
                {
                    "env_id": env_id,
                    "task_id": str(record["task_id"]),
                    "sample": int(record.get("sample") or 0),
                    "policy": str(record.get("policy") or ""),
                    "reward": float(record.get("reward") or 0.0),
                    "correct": bool(record.get("correct")),
                    "messages": messages,
                    "input_ids": ids,
                    "assistant_masks": mask,
                    "ids_source": "policy" if policy_ids is not None else "env",
                    "replay_ok": matches,
                }
            )
    finally:
        for env in envs.values():
            env.close()
    if not rows:
        raise InvalidConfigError(
            "no records to export"
            + (f" for env ids {sorted(wanted)}" if wanted is not None else "")
            + (f" with reward >= {min_reward}" if min_reward is not None else "")
        )
    return datasets.Dataset.from_list(rows)
