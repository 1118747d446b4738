"""Run an evaluation: env ids x tasks x samples, one durable record per rollout.

:func:`run_eval` plans every rollout up front — for each env id, ``tasks``
tasks of its split drawn with the seed, each played ``samples`` times; rollout
``i`` of an env (``task_index * samples + sample``) always gets the same reset
and sampling seeds — then plays only the rollouts missing from
``OUT/rollouts.jsonl`` (all of them on a fresh run; the rest after a crash,
with ``--resume``), at most ``concurrency`` at a time per env id, appending
each record as it finishes. The summary, report and plots are computed from
the records alone, so a resumed run ends with the same ``summary.json`` as
an uninterrupted one (wall-clock figures, under ``timing``, aside).

A rollout that raised instead of ending (the endpoint unreachable or refusing,
an engine or env crash, an env that cannot be built: never the policy's own
mistakes, which are observations) is recorded with ``error`` set. Such a
record is not a score: an env id with any failed rollout gets no metrics in
the summary (``status: "failed"``, how many failed and the first error), the
command exits non-zero, and ``--resume`` plays the failed rollouts again.
Scoring only complete env ids keeps an outage from reading as accuracy 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vt_bench.evals.metrics import summarize_env
from vt_bench.evals.policies import PolicySpec, parse_policy
from vt_bench.evals.records import RecordFile, record_key
from vt_envs.errors import InvalidConfigError, NoImageTokenError, UnknownNameError

logger = logging.getLogger(__name__)

__all__ = [
    "KIND_KEYS",
    "EvalConfig",
    "failures",
    "plan_tasks",
    "rollout_seed",
    "run_eval",
    "summarize",
    "task_kind",
]

# The task metadata keys that name a task's kind, first present wins: ``family``
# (VT-Math-v0's generator, VT-Multi-v0), ``kind`` (VT-Visual-v0, VT-Search-v0,
# VT-SWE-v0's mutation), ``template`` (VT-SQL-v0's question template), ``type``
# (MATH's subject on user data). VT-Lookup-v0 and most user data have none.
KIND_KEYS = ("family", "kind", "template", "type")


def task_kind(metadata: Mapping[str, Any]) -> str | None:
    """The task's kind or family (see :data:`KIND_KEYS`), or ``None``."""
    for key in KIND_KEYS:
        value = metadata.get(key)
        if value is not None and value != "":
            return str(value)
    return None


@dataclass
class EvalConfig:
    """Everything that decides what an evaluation plays (saved as ``OUT/config.json``).

    Attributes:
        env_ids: registered env ids.
        policy: the ``--policy`` text (see :mod:`vt_bench.evals.policies`).
        model, api: for ``openai:URL``: the served model's name; ``completions``
            (token ids) or ``chat`` (messages).
        tokenizer: the env's tokenizer directory (default: the model directory for
            ``hf:``/``vllm:``; the shipped one otherwise). With the completions API it
            must be the served model's.
        tasks: tasks per env id (at most its split's size), drawn with ``seed``.
        samples: rollouts per task (``k`` of pass@k).
        split: the split played (``test``: the held-out one).
        temperature, top_p, max_new_tokens, max_context: sampling (models only).
        concurrency: rollouts in flight per env id (sub-envs; model requests batch).
        env_kwargs: keywords for every env (``{"max_turns": 4}``).
        env_kwargs_by_id: env id -> keywords for that env alone, over ``env_kwargs``
            (``{"VT-Math-v0": {"families": ["modpow"]}}``); each id must be one the
            run plays.
        skipped: env id -> why ``all`` left it out (an image env for a text-only
            model); filled by :func:`run_eval`.
        imports: modules or ``.py`` files imported first (their ``register_env``
            calls make their env ids playable by name); recorded, so ``--resume``
            imports them again (:mod:`vt_envs.core.plugins`).
    """

    env_ids: list[str]
    policy: str
    model: str = ""
    api: str = "completions"
    tokenizer: str | None = None
    tasks: int = 20
    samples: int = 1
    seed: int = 0
    split: str = "test"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_context: int | None = 4096
    concurrency: int = 8
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_kwargs_by_id: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    imports: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from vt_envs.core.plugins import import_plugins

        self.imports = import_plugins(self.imports)
        for name in ("tasks", "samples", "concurrency", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not self.env_ids:
            raise InvalidConfigError("give at least one env id (or 'all')")
        for env_id, kwargs in self.env_kwargs_by_id.items():
            if not isinstance(kwargs, dict):
                raise InvalidConfigError(
                    f"env_kwargs_by_id[{env_id!r}] must be a JSON object of keywords, "
                    f"got {kwargs!r}"
                )
        every = [self.env_kwargs, *self.env_kwargs_by_id.values()]
        if any("token" in key for kwargs in every for key in kwargs):
            raise InvalidConfigError(
                "env_kwargs would write a token into config.json; give the tool server's "
                "token in $VT_TOOL_SERVER_TOKEN instead"
            )
        parse_policy(self.policy, model=self.model, api=self.api)  # raises if malformed

    @property
    def spec(self) -> PolicySpec:
        return parse_policy(self.policy, model=self.model, api=self.api)

    def env_tokenizer(self) -> str | None:
        spec = self.spec
        return self.tokenizer or (spec.target if spec.kind in ("hf", "vllm") else None)


def rollout_seed(seed: int, index: int, turn: int) -> int:
    """A 31-bit seed that depends only on (evaluation seed, rollout index, turn); turn -1
    is the reset. The same derivation as the trainer's rollouts
    (:func:`vt_train.rollout.stream`), so token-level records name their real seeds."""
    return int(np.random.SeedSequence([seed, index, turn + 1]).generate_state(1)[0]) & 0x7FFFFFFF


def plan_tasks(tasks: Any, count: int, seed: int) -> list[str]:
    """``count`` task ids of ``tasks`` (a task source), drawn without replacement with
    ``seed`` and kept in source order; all of them when it has no more."""
    return [task.id for task in _planned(tasks, count, seed)]


def _planned(tasks: Any, count: int, seed: int) -> list[Any]:
    size = len(tasks)
    if count >= size:
        return [tasks[i] for i in range(size)]
    chosen = np.random.default_rng(seed).choice(size, size=count, replace=False)
    return [tasks[int(i)] for i in sorted(chosen)]


# ---------------------------------------------------------------- records


def _record(
    env_id: str, task_id: str, sample: int, seed: int, policy: str, **fields: Any
) -> dict[str, Any]:
    parts = dict(fields.pop("reward_parts") or {})
    return {
        "env_id": env_id,
        "task_id": task_id,
        "sample": sample,
        "seed": seed,
        "policy": policy,
        "reward": float(fields.pop("reward")),
        "correct": parts.get("outcome", 0.0) >= 1.0,
        "reward_parts": parts,
        **fields,
        "error": None,
    }


def _tool_calls(turn: int, info: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = info.get("tools") or ([info["tool"]] if "tool" in info else [])
    return [
        {"turn": turn, **{k: c.get(k) for k in ("name", "ok", "error")},
         "latency_s": float(c.get("latency_s", 0.0))}
        for c in calls
    ]  # fmt: skip


def _turn_tokens(mask: Sequence[int], turns: int) -> list[tuple[int, int]]:
    """``(ids read new, ids written)`` per turn, from a trajectory's loss mask runs."""
    runs: list[list[int]] = []  # [mask value, length]
    for m in mask:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    pairs, pending_in = [], 0
    for value, length in runs:
        if value == 0:
            pending_in += length
        else:
            pairs.append((pending_in, length))
            pending_in = 0
    pairs += [(pending_in, 0)] * max(0, turns - len(pairs))  # turns that wrote nothing
    return pairs[:turns]


# ------------------------------------------------------------------ text policies


class _ScriptedAgent:
    """A :class:`~vt_envs.core.policy.Policy` (oracle, baseline) behind the agent API."""

    def __init__(self, policy: Any):
        self.policy = policy

    def start(self, obs: Mapping[str, Any], info: Mapping[str, Any], task: Any) -> None:
        self.policy.reset(task)
        self.obs, self.info = obs, info

    def observe(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        self.obs, self.info = obs, info

    async def act(self, seed: int) -> tuple[str, str | None]:
        return self.policy.act(self.obs["text"], self.info), None


class _ChatAgent:
    def __init__(self, chat: Any):
        self.chat = chat

    def start(self, obs: Mapping[str, Any], info: Mapping[str, Any], task: Any) -> None:
        self.chat.start(obs, info)

    def observe(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        self.chat.observe(obs, info)

    async def act(self, seed: int) -> tuple[str, str | None]:
        return await self.chat.act(seed)


async def _text_rollout(
    env: Any, agent: Any, env_id: str, task_id: str, sample: int, index: int, config: EvalConfig
) -> dict[str, Any]:
    start = time.perf_counter()
    seed = rollout_seed(config.seed, index, -1)
    obs, info = await env.areset(seed=seed, options={"task_id": task_id})
    agent.start(obs, info, env.unwrapped.task)
    domain = str(info.get("env_id") or env_id)  # a mixture's member, else the env itself
    transcript, turns, calls = [obs["text"]], [], []
    read, seen = len(obs["tokens"]), int(info["episode_tokens"])
    turn = 0
    while True:
        action, finish = await agent.act(rollout_seed(config.seed, index, turn))
        obs, reward, terminated, truncated, info = await env.astep(action)
        written = int(info["episode_tokens"]) - seen - len(obs["tokens"])
        turns.append({"tokens_in": read, "tokens_out": max(written, 0),
                      "finish_reason": finish, "action": action})  # fmt: skip
        calls += _tool_calls(turn, info)
        transcript += [action, obs["text"]]
        read, seen = len(obs["tokens"]), int(info["episode_tokens"])
        turn += 1
        if terminated or truncated:
            break
        agent.observe(obs, info)
    return _record(
        env_id, task_id, sample, config.seed, config.spec.label(), rollout_index=index,
        reset_seed=seed, domain=domain,
        reward=reward, reward_parts=info.get("reward_parts"),
        verifier_parts=dict(info.get("verifier_parts") or {}),
        terminated=bool(terminated), truncated=bool(truncated),
        truncation=info.get("truncation"), turns=turns, tool_calls=calls,
        invalid_actions=int(info.get("invalid_actions", 0)),
        transcript="".join(transcript), token_ids=None,
        elapsed_s=time.perf_counter() - start,
    )  # fmt: skip


async def _run_text(
    env_id: str,
    config: EvalConfig,
    plan: list[tuple[int, str, int]],
    make_agent: Callable[[Any], Any],
    on_record: Callable[[dict[str, Any]], None],
) -> None:

    width = min(config.concurrency, len(plan))
    envs = [make_env(env_id, wrapped=True, **_env_kwargs(config, env_id)) for _ in range(width)]
    free: asyncio.Queue[Any] = asyncio.Queue()
    for env in envs:
        free.put_nowait(env)

    async def play(index: int, task_id: str, sample: int) -> None:
        env = await free.get()
        start = time.perf_counter()
        try:
            record = await _text_rollout(
                env, make_agent(env), env_id, task_id, sample, index, config
            )
        except Exception as exc:  # the endpoint gave up on this rollout: record it, go on
            record = _failed_record(config, env_id, task_id, sample, index, exc, start)
        finally:
            free.put_nowait(env)
        on_record(record)

    try:
        await _gather_all(play(*p) for p in plan)
    finally:
        for env in envs:
            await env.aclose()


def _failed_record(
    config: EvalConfig, env_id: str, task_id: str, sample: int, index: int,
    exc: BaseException, start: float,
) -> dict[str, Any]:  # fmt: skip
    """A rollout that raised (``error``: the exception): not a score; its env id gets no
    metrics and ``--resume`` plays it again."""
    record = _record(
        env_id, task_id, sample, config.seed, config.spec.label(), rollout_index=index,
        reset_seed=rollout_seed(config.seed, index, -1), reward=0.0, reward_parts={},
        verifier_parts={}, terminated=False, truncated=True, truncation="error", turns=[],
        tool_calls=[], invalid_actions=0, transcript="", token_ids=None,
        elapsed_s=time.perf_counter() - start,
    )  # fmt: skip
    record["error"] = f"{type(exc).__name__}: {exc}"
    return record


async def _gather_all(coroutines: Any) -> None:
    """Run the coroutines; on the first error cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ------------------------------------------------------------------ token policies


async def _run_tokens(
    env_id: str,
    config: EvalConfig,
    task_ids: list[str],
    missing: list[int],
    engine: Any,
    on_record: Callable[[dict[str, Any]], None],
) -> None:
    from vt_envs.vector import ToolVectorEnv
    from vt_train.engines.base import SamplingParams
    from vt_train.rollout import stream

    width = min(config.concurrency, len(missing))
    venv = ToolVectorEnv([make_env(env_id, **_env_kwargs(config, env_id)) for _ in range(width)])
    tokenizer = venv.envs[0].unwrapped.tokenizer
    sampling = SamplingParams(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p
    )
    try:
        async for t in stream(
            engine, venv, task_ids, n_samples=config.samples, sampling=sampling,
            seed=config.seed, max_context=config.max_context, only=missing,
        ):  # fmt: skip
            index = t.metadata["rollout_index"]
            latencies = t.metadata["timing"]["tool_call_latencies_s"]
            calls = [{**c, "latency_s": s} for c, s in zip(t.metadata["tool_log"], latencies)]
            pairs = _turn_tokens(t.loss_mask, t.turns)
            turns = [
                {"tokens_in": i, "tokens_out": o, "finish_reason": f, "action": a}
                for (i, o), f, a in zip(pairs, t.finish_reasons, t.actions)
            ]
            timing = t.metadata["timing"]
            on_record(
                _record(
                    env_id, t.task_id, t.metadata["sample"], config.seed, config.spec.label(),
                    reward=t.reward, reward_parts=t.reward_parts,
                    verifier_parts=t.metadata.get("verifier_parts", {}),
                    terminated=t.terminated, truncated=t.truncated,
                    truncation=t.metadata["truncation"], turns=turns, tool_calls=calls,
                    invalid_actions=t.invalid_actions,
                    transcript=tokenizer.decode(t.input_ids), token_ids=list(t.input_ids),
                    rollout_index=index, reset_seed=rollout_seed(config.seed, index, -1),
                    elapsed_s=timing["generate_s"] + timing["step_s"],
                    domain=str(t.metadata.get("env_id") or env_id),
                )
            )  # fmt: skip
    finally:
        await venv.aclose()


def _engine(config: EvalConfig) -> Any:
    spec = config.spec
    tokenizer = config.env_tokenizer()
    if spec.kind == "hf":
        from vt_train.engines.hf import HFEngine

        return HFEngine(spec.target, tokenizer, max_batch_size=config.concurrency, seed=config.seed)
    if spec.kind == "vllm":
        from vt_train.engines.vllm import VLLMEngine

        return VLLMEngine(spec.target, tokenizer=tokenizer, seed=config.seed)
    from vt_bench.evals.openai_api import CompletionsEngine, OpenAIClient
    from vt_envs.core.tokenizer import load_tokenizer

    client = OpenAIClient(spec.target, api_key=os.environ.get("OPENAI_API_KEY"))
    return CompletionsEngine(client, spec.model, load_tokenizer(tokenizer))


def _env_kwargs(config: EvalConfig, env_id: str) -> dict[str, Any]:
    kwargs = {"split": config.split, **config.env_kwargs, **config.env_kwargs_by_id.get(env_id, {})}
    tokenizer = config.env_tokenizer()
    if tokenizer is not None:
        kwargs.setdefault("tokenizer", tokenizer)
    return kwargs


def _text_agents(config: EvalConfig, env_id: str) -> tuple[Callable[[Any], Any], Any]:
    """A factory of per-episode agents, and the client to close afterwards (or None)."""
    import vt_envs
    from vt_envs.vector.mixture import MixturePolicy, parse_mixture_id

    spec = config.spec
    mixture = parse_mixture_id(env_id) is not None
    if spec.kind == "oracle":
        if mixture:  # each episode played by its domain's oracle
            return (lambda env: _ScriptedAgent(MixturePolicy(vt_envs.oracle_for))), None
        return (lambda env: _ScriptedAgent(vt_envs.oracle_for(env_id))), None
    if spec.kind == "no-tool":
        if mixture:
            return (
                lambda env: _ScriptedAgent(
                    MixturePolicy(lambda e: vt_envs.baseline_for(e, env.unwrapped.members[e]))
                )
            ), None
        return (lambda env: _ScriptedAgent(vt_envs.baseline_for(env_id, env))), None
    if spec.kind == "shortcut":
        name = spec.target or None
        if mixture:
            return (
                lambda env: _ScriptedAgent(
                    MixturePolicy(lambda e: vt_envs.shortcut_for(e, name, env.unwrapped.members[e]))
                )
            ), None
        return (lambda env: _ScriptedAgent(vt_envs.shortcut_for(env_id, name, env))), None
    from vt_bench.evals.openai_api import ChatAgent, OpenAIClient

    client = OpenAIClient(spec.target, api_key=os.environ.get("OPENAI_API_KEY"))

    def chat(env: Any) -> Any:
        from vt_train.engines.base import SamplingParams

        params = SamplingParams(
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            stop=tuple(env.stop_strings),
        )
        return _ChatAgent(ChatAgent(client, spec.model, params))

    return chat, client


# ------------------------------------------------------------------ the run


def _resolve_ids(env_ids: Sequence[str]) -> list[str]:
    import vt_envs
    from vt_envs.registration import registration_of
    from vt_envs.vector.mixture import parse_mixture_id

    known = list(vt_envs.registered_envs())
    ids = known if list(env_ids) == ["all"] else list(env_ids)
    for env_id in ids:
        for member in parse_mixture_id(env_id) or [env_id]:
            try:
                registration_of(member)  # "my_pkg.envs:MyOrg/Env-v0" imports my_pkg.envs
            except UnknownNameError:
                raise InvalidConfigError(
                    f"unknown env id {member!r}; registered: {known}. An env of another "
                    "package: --import MODULE, or name it MODULE:ID"
                ) from None
    return ids


def make_env(env_id: str, *, wrapped: bool = False, **kwargs: Any) -> Any:
    """``vt_envs.make(env_id)`` (``gym.make`` if ``wrapped``), or the mixture a
    ``mixture:ID=W,...`` id names (its members are raw envs)."""
    import gymnasium as gym

    import vt_envs
    from vt_envs.vector.mixture import parse_mixture_id

    weights = parse_mixture_id(env_id)
    if weights is not None:
        return vt_envs.make_mixture(weights, **kwargs)
    return gym.make(env_id, **kwargs) if wrapped else vt_envs.make(env_id, **kwargs)


def _check_shortcut(env_id: str, name: str) -> None:
    """Raise :class:`UnknownNameError` unless every domain ``env_id`` plays registers the
    shortcut ``name`` (``""``: any)."""
    import vt_envs
    from vt_envs.registration import registration_of
    from vt_envs.vector.mixture import parse_mixture_id

    for member in parse_mixture_id(env_id) or [env_id]:
        shortcuts = registration_of(member).shortcuts
        if not shortcuts or (name and name not in shortcuts):
            vt_envs.shortcut_for(member, name or None)  # raises, naming what there is


def _plan_env(env_id: str, config: EvalConfig) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The env's planned task ids, and each one's ``{"kind", "task"}`` (its metadata)."""
    if config.spec.kind == "shortcut":
        _check_shortcut(env_id, config.spec.target)
    env = make_env(env_id, **_env_kwargs(config, env_id))
    try:
        tasks = _planned(env.tasks, config.tasks, config.seed)
        facts = {}
        for task in tasks:
            metadata = _json_safe(dict(task.metadata))
            facts[task.id] = {"kind": task_kind(metadata), "task": metadata}
        return [task.id for task in tasks], facts
    finally:
        env.close()


def _json_safe(value: Any) -> Any:
    """``value`` as JSON would read it back (tuples as lists, other objects as text)."""
    return json.loads(json.dumps(value, default=str))


def summarize(records: Sequence[Mapping[str, Any]], config: EvalConfig) -> dict[str, Any]:
    """``summary.json``: the config and each env id's metrics (from the records alone).

    An env id with a failed rollout (``error`` set) is not scored: its entry is
    ``{"status": "failed", "episodes", "failed", "first_error"}`` and nothing else.
    """
    by_env: dict[str, list[Mapping[str, Any]]] = {e: [] for e in config.env_ids}
    for r in records:
        if r["env_id"] in by_env:
            by_env[r["env_id"]].append(r)
    envs = {}
    for env_id, rs in by_env.items():
        failed = sorted(
            (r for r in rs if r.get("error") is not None),
            key=lambda r: (r.get("rollout_index", 0), r["task_id"], r["sample"]),
        )
        if failed:
            envs[env_id] = {
                "status": "failed",
                "episodes": len(rs),
                "failed": len(failed),
                "first_error": str(failed[0]["error"]),
            }
            continue
        envs[env_id] = {"status": "complete", **summarize_env(rs)}
        domains: dict[str, list[Mapping[str, Any]]] = {}
        for r in rs:
            domains.setdefault(str(r.get("domain") or env_id), []).append(r)
        if len(domains) > 1:  # a mixture: each domain's metrics too
            envs[env_id]["domains"] = {d: summarize_env(domains[d]) for d in sorted(domains)}
    return {
        "policy": config.spec.label(),
        "config": asdict(config),
        "envs": envs,
        "skipped": dict(config.skipped),
    }


def failures(summary: Mapping[str, Any]) -> tuple[int, int, str | None]:
    """``(failed rollouts, rollouts, the first error)`` over a summary's env ids."""
    failed = total = 0
    first = None
    for m in summary["envs"].values():
        total += int(m["episodes"])
        if m.get("status") == "failed":
            failed += int(m["failed"])
            first = first or m["first_error"]
    return failed, total, first


def run_eval(
    config: EvalConfig, out: str | os.PathLike[str], *, progress: bool = True
) -> dict[str, Any]:
    """Play what is missing from ``out`` (see the module docstring); write
    ``summary.json``, ``REPORT.md`` and the plots; return the summary.

    Raises:
        InvalidConfigError: ``out`` holds an evaluation with another config.
    """
    from vt_bench.evals.report import write_report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    every = list(config.env_ids) == ["all"]
    config.env_ids = _resolve_ids(config.env_ids)
    unknown = sorted(set(config.env_kwargs_by_id) - set(config.env_ids))
    if unknown:
        raise InvalidConfigError(
            f"--env-kwargs names {unknown}, which this run does not play; the env ids are "
            f"{config.env_ids} (give ID=JSON with one of them, or plain JSON for every env)"
        )
    plans, facts = {}, {}
    for env_id in config.env_ids:
        try:
            plans[env_id], facts[env_id] = _plan_env(env_id, config)
        except NoImageTokenError as error:
            if not every:  # named explicitly: the user asked for it, so say why not
                raise
            config.skipped[env_id] = f"text-only model: {error}"
            logger.warning("vt-bench eval all: skipping %s (%s)", env_id, error)
        except UnknownNameError as error:
            if not every or config.spec.kind != "shortcut":
                raise
            config.skipped[env_id] = f"no shortcut: {error}"
            logger.warning("vt-bench eval all: skipping %s (no shortcut registered)", env_id)
    config.env_ids = list(plans)
    if not plans:
        raise InvalidConfigError(f"no env id can be played by this policy: {config.skipped}")
    saved = out / "config.json"
    if saved.is_file() and json.loads(saved.read_text()) != asdict(config):
        raise InvalidConfigError(
            f"{out} holds an evaluation with another config ({saved}); resume it with "
            "--resume DIR alone, or choose a new --out"
        )
    _write_atomically(saved, json.dumps(asdict(config), indent=2) + "\n")
    store = RecordFile(out / "rollouts.jsonl")
    # A failed rollout (error set) is not done: it is played again.
    done = {record_key(r) for r in store.read() if r.get("error") is None}
    todo = {
        env_id: [
            (t * config.samples + s, task_id, s)
            for t, task_id in enumerate(task_ids)
            for s in range(config.samples)
            if (env_id, task_id, s) not in done
        ]
        for env_id, task_ids in plans.items()
    }
    total = sum(len(p) for p in plans.values()) * config.samples
    bar = _progress(total, total - sum(map(len, todo.values())), progress)
    scores: list[bool] = [bool(r["correct"]) for r in store.read() if r.get("error") is None]
    failed = 0

    def on_record(record: dict[str, Any]) -> None:
        nonlocal failed
        record.update(facts[record["env_id"]].get(record["task_id"], {"kind": None, "task": {}}))
        store.append(record)
        bar.update(1)
        if record["error"] is not None:
            failed += 1
            bar.set_postfix(env=record["env_id"], failed=failed)
            return
        scores.append(bool(record["correct"]))
        bar.set_postfix(env=record["env_id"], acc=f"{sum(scores) / len(scores):.3f}")

    try:
        asyncio.run(_play(config, plans, todo, on_record))
    finally:
        bar.close()
        store.close()
    summary = summarize(store.read(), config)
    _write_atomically(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_report(summary, out)
    return summary


async def _play(
    config: EvalConfig,
    plans: Mapping[str, list[str]],
    todo: Mapping[str, list[tuple[int, str, int]]],
    on_record: Callable[[dict[str, Any]], None],
) -> None:
    spec = config.spec
    engine = _engine(config) if spec.token_level and any(todo.values()) else None
    try:
        for env_id, plan in todo.items():
            if plan:
                await _play_env(config, env_id, plans[env_id], plan, engine, on_record)
    finally:
        if engine is not None:
            await engine.aclose()


async def _play_env(
    config: EvalConfig,
    env_id: str,
    task_ids: list[str],
    plan: list[tuple[int, str, int]],
    engine: Any,
    on_record: Callable[[dict[str, Any]], None],
) -> None:
    """Play one env id's missing rollouts. When the env cannot be built or the engine
    raises (which cancels the rollouts in flight), every rollout not recorded yet is
    recorded as failed with that error, and the run goes on with the next env id."""
    recorded: set[int] = set()

    def keep(record: dict[str, Any]) -> None:
        recorded.add(int(record["rollout_index"]))
        on_record(record)

    start = time.perf_counter()
    try:
        if engine is not None:
            missing = [index for index, _, _ in plan]
            await _run_tokens(env_id, config, task_ids, missing, engine, keep)
            return
        make_agent, client = _text_agents(config, env_id)
        try:
            await _run_text(env_id, config, plan, make_agent, keep)
        finally:
            if client is not None:
                await client.aclose()
    except Exception as exc:
        logger.warning("vt-bench eval: %s stopped: %s: %s", env_id, type(exc).__name__, exc)
        for index, task_id, sample in plan:
            if index not in recorded:
                on_record(_failed_record(config, env_id, task_id, sample, index, exc, start))


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def _progress(total: int, done: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc="rollouts", unit="ep", disable=not enabled)
