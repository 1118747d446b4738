"""Rollout collection: a :class:`RolloutEngine` plays episodes of a ``ToolVectorEnv``.

Each trajectory is a loop, token-in / token-out::

    ids = reset(task)                          # the prompt ids, mask 0
    while not done:
        gen = await engine.generate(ids)       # kept exactly as sampled, mask 1
        obs, done = await env.astep(gen ids)   # the env's ids up to the next action, mask 0
        ids += gen.token_ids + obs["tokens"]

Nothing is ever re-tokenized, so ``input_ids`` is exactly what the policy saw
and produced, and ``loss_mask`` is 1 exactly on the ids the engine returned
(boundary tokens the env inserts, such as ``<|im_end|>\\n`` after a stop
string, arrive with the observation and are masked out).

Images (envs with ``obs["images"]``): each observation's images are appended
to the trajectory's image list with its ids (image-pad ids are observation
ids, mask 0), held by reference, with each image's span in the ids
(``Trajectory.image_spans``), and the engine gets the list so far with
every request, in the order the images' tokens appear. Equal images seen by
several trajectories of one collection (a GRPO group's task image) are kept
once (:class:`~vt_train.vision.ImageInterner`).

Two schedules run the same per-turn code:

- ``mode="async"`` (trajectory-level asynchrony, the default): one coroutine
  per trajectory; a trajectory generates its next turn as soon as its own tool
  call returns, so a slow tool blocks only its own trajectory while the engine
  keeps batching whatever requests are pending.
- ``mode="sync"`` (the baseline of peer systems, kept for the speed
  benchmark): turn by turn, every active trajectory generates (the requests
  are issued together and awaited together), then every tool runs, then the
  next turn starts; each turn waits for its slowest generation and slowest tool.

With a deterministic engine both schedules give identical trajectories:
sampling seeds are derived from ``(seed, trajectory, turn)``, never from the
order in which requests happen to run.

Sub-envs: the vector env may have fewer sub-envs than trajectories. In async
mode a free-list hands a sub-env to each trajectory in order and takes it back
when the episode ends; in sync mode trajectories run in waves of
``venv.num_envs``. Every episode is reset with the task given inline and its
own seed, so which sub-env runs it does not change the result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from vt_envs.core.task import Task
from vt_envs.errors import InvalidConfigError
from vt_envs.vector import ToolVectorEnv
from vt_train.engines.base import Generation, RolloutEngine, SamplingParams
from vt_train.trajectory import Trajectory
from vt_train.vision import ImageInterner

__all__ = ["ROLLOUT_MODES", "collect", "merge_stop_strings", "stream", "turn_seed"]

ROLLOUT_MODES = ("async", "sync")


def merge_stop_strings(*groups: Sequence[str]) -> tuple[str, ...]:
    """Concatenate stop-string lists, dropping duplicates and keeping first-seen order."""
    return tuple(dict.fromkeys(s for group in groups for s in group))


@dataclass
class _Setup:
    """What every trajectory of one collection shares."""

    engine: RolloutEngine
    venv: ToolVectorEnv
    sampling: SamplingParams  # stop strings already merged with the env's
    seed: int
    max_context: int | None
    images: ImageInterner = field(default_factory=ImageInterner)


@dataclass
class _Rollout:
    """One trajectory in progress (mutable; frozen into a :class:`Trajectory` at the end)."""

    index: int  # position in the result: task-major, ``task_index * n_samples + sample``
    task: Task | str
    group_id: int
    sample: int
    task_id: str = ""
    env_id: str = ""  # the domain: a mixture member's id, else the env's name
    env_index: int = -1  # the sub-env that ran it
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    truncation: str | None = None
    done: bool = False
    turns: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # the latest step's info
    finish_reasons: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)  # by reference, in token order
    image_spans: list[tuple[int, int]] = field(default_factory=list)
    tool_latency_s: float = 0.0
    tool_log: list[dict[str, Any]] = field(default_factory=list)  # one entry per call
    tool_latencies_s: list[float] = field(default_factory=list)  # the same calls' latencies
    generate_s: float = 0.0
    step_s: float = 0.0
    step_latencies_s: list[float] = field(default_factory=list)  # each env step's

    def append(
        self, ids: Sequence[int], *, generated: bool, logprobs: Sequence[float] = ()
    ) -> None:
        """Append ids: generated ones with mask 1 and their logprobs, others with mask 0, 0.0."""
        self.input_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([int(generated)] * len(ids))
        self.logprobs.extend([float(x) for x in logprobs] if generated else [0.0] * len(ids))

    def to_trajectory(self) -> Trajectory:
        return Trajectory(
            task_id=self.task_id,
            group_id=self.group_id,
            input_ids=self.input_ids,
            loss_mask=self.loss_mask,
            rollout_logprobs=self.logprobs,
            prompt_length=self.prompt_length,
            reward=self.reward,
            reward_parts=self.reward_parts,
            terminated=self.terminated,
            truncated=self.truncated,
            turns=self.turns,
            tool_calls=int(self.info.get("tool_calls", 0)),
            tool_errors=int(self.info.get("tool_errors", 0)),
            invalid_actions=int(self.info.get("invalid_actions", 0)),
            finish_reasons=self.finish_reasons,
            actions=self.actions,
            images=self.images,
            image_spans=self.image_spans,
            metadata={
                "rollout_index": self.index,
                "sample": self.sample,
                "env_index": self.env_index,
                "env_id": self.env_id,
                "truncation": self.truncation,
                # Each call: the turn it was made on, name, ok, error.
                "tool_log": self.tool_log,
                "verifier_parts": dict(self.info.get("verifier_parts") or {}),
                # Wall-clock facts: they differ between runs, unlike everything else.
                "timing": {
                    "generate_s": self.generate_s,
                    "step_s": self.step_s,
                    "step_latencies_s": self.step_latencies_s,
                    "tool_latency_s": self.tool_latency_s,
                    "tool_call_latencies_s": self.tool_latencies_s,
                },
            },
        )


# ------------------------------------------------------------ one turn's parts


async def _start(setup: _Setup, r: _Rollout, env_index: int) -> None:
    """Reset sub-env ``env_index`` on the trajectory's task; append the prompt (mask 0)."""
    options = {"task": r.task} if isinstance(r.task, Task) else {"task_id": r.task}
    seed = turn_seed(setup.seed, r.index, -1) & 0x7FFFFFFF
    obs, info = await setup.venv.areset_at(env_index, seed=seed, options=options)
    r.task_id = str(info["task_id"])
    r.env_id = str(info.get("env_id") or getattr(setup.venv.envs[env_index].unwrapped, "name", ""))
    r.env_index = env_index
    _append_observation(setup, r, env_index, obs)
    r.prompt_length = len(r.input_ids)
    r.info = info


def _request(setup: _Setup, r: _Rollout) -> SamplingParams | None:
    """The next turn's sampling params, or ``None`` when the context budget
    leaves no room to generate (the caller then ends the episode)."""
    params = replace(setup.sampling, seed=turn_seed(setup.seed, r.index, r.turns))
    if setup.max_context is None:
        return params
    room = setup.max_context - len(r.input_ids)
    if room < 1:
        return None
    return replace(params, max_new_tokens=min(params.max_new_tokens, room))


async def _end_at_context_limit(setup: _Setup, r: _Rollout, env_index: int) -> None:
    """The context budget is spent: end the episode through the env, so its
    truncation shaping, ``reward_parts`` and session close happen as for its
    own budgets."""
    obs, reward, terminated, truncated, info = await setup.venv.atruncate_at(
        env_index, "max_context"
    )
    _record_end(r, reward, terminated, truncated, info)


def _record_end(r: _Rollout, reward: float, terminated: bool, truncated: bool, info: dict) -> None:
    r.info = info
    r.reward += float(reward)
    r.done, r.terminated, r.truncated = True, bool(terminated), bool(truncated)
    r.truncation = info.get("truncation")
    r.reward_parts = dict(info.get("reward_parts", {}))


async def _generate(setup: _Setup, r: _Rollout) -> Generation | None:
    params = _request(setup, r)
    if params is None:
        return None
    start = time.perf_counter()
    # Images only when there are some: a text engine need not know the keyword.
    extra = {"images": tuple(r.images)} if r.images else {}
    generation = await setup.engine.generate(list(r.input_ids), params, **extra)
    r.generate_s += time.perf_counter() - start
    if len(generation.logprobs) != len(generation.token_ids):
        raise ValueError(
            f"{type(setup.engine).__name__}.generate returned {len(generation.token_ids)} ids "
            f"but {len(generation.logprobs)} logprobs; an engine must return one logprob per id"
        )
    return generation


async def _step(setup: _Setup, r: _Rollout, env_index: int, generation: Generation) -> None:
    """Append the generated ids (mask 1), step the env with them, append its observation."""
    ids = np.asarray(generation.token_ids, dtype=np.int64)
    r.append(generation.token_ids, generated=True, logprobs=generation.logprobs)
    r.finish_reasons.append(generation.finish_reason)
    r.actions.append(setup.venv.envs[env_index].unwrapped.tokenizer.decode(ids))
    r.turns += 1
    start = time.perf_counter()
    obs, reward, terminated, truncated, info = await setup.venv.astep_at(env_index, ids)
    elapsed = time.perf_counter() - start
    r.step_s += elapsed
    r.step_latencies_s.append(elapsed)
    for tool_info in info.get("tools") or ([info["tool"]] if "tool" in info else []):
        r.tool_latency_s += float(tool_info.get("latency_s", 0.0))
        r.tool_log.append({"turn": r.turns - 1, **{k: tool_info.get(k) for k in _CALL_FACTS}})
        r.tool_latencies_s.append(float(tool_info.get("latency_s", 0.0)))
    if terminated or truncated:
        _record_end(r, reward, terminated, truncated, info)
        return
    r.info = info
    r.reward += float(reward)
    # The observation is appended only when the policy will read it: at the
    # context limit the episode ends here, without a trailing unread observation.
    if setup.max_context is not None and len(r.input_ids) + len(obs["tokens"]) >= setup.max_context:
        await _end_at_context_limit(setup, r, env_index)
        return
    _append_observation(setup, r, env_index, obs)


_CALL_FACTS = ("name", "ok", "error")


def _append_observation(setup: _Setup, r: _Rollout, env_index: int, obs: dict) -> None:
    """Append an observation's ids (mask 0) and its images with their token spans."""
    offset = len(r.input_ids)
    r.append(obs["tokens"], generated=False)
    images = obs.get("images", ())
    if not images:
        return
    encoding = setup.venv.envs[env_index].unwrapped.image_tokens
    spans = encoding.spans(obs["tokens"].tolist())
    if len(spans) != len(images):
        raise ValueError(
            f"sub-env {env_index}'s observation holds {len(images)} images but "
            f"{len(spans)} image spans in its ids; the env's image tokens are inconsistent"
        )
    r.images.extend(setup.images.intern(image) for image in images)
    r.image_spans.extend((offset + start, offset + end) for start, end in spans)


def turn_seed(seed: int, index: int, turn: int) -> int:
    """The 32-bit sampling seed of trajectory ``index``'s turn ``turn`` in a collection
    seeded ``seed`` (turn ``-1``: its reset). It depends on nothing else, so a scripted
    engine can tell from ``params.seed`` which trajectory and turn a request is."""
    return int(np.random.SeedSequence([seed, index, turn + 1]).generate_state(1)[0])


# ------------------------------------------------------------------ schedules


async def _async_schedule(setup: _Setup, rollouts: list[_Rollout]) -> AsyncIterator[_Rollout]:
    """One task per trajectory; yields each as it finishes."""
    free: asyncio.Queue[int] = asyncio.Queue()
    for env_index in range(setup.venv.num_envs):
        free.put_nowait(env_index)

    async def run(r: _Rollout) -> _Rollout:
        env_index = await free.get()  # FIFO: trajectories get sub-envs in order
        try:
            await _start(setup, r, env_index)
            while not r.done:
                generation = await _generate(setup, r)
                if generation is None:
                    await _end_at_context_limit(setup, r, env_index)
                else:
                    await _step(setup, r, env_index, generation)
        finally:
            free.put_nowait(env_index)
        return r

    tasks = [asyncio.ensure_future(run(r)) for r in rollouts]
    try:
        for finished in asyncio.as_completed(tasks):
            yield await finished
    finally:  # an error (or a consumer that stops early) cancels the rest
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _sync_schedule(setup: _Setup, rollouts: list[_Rollout]) -> AsyncIterator[_Rollout]:
    """Turn by turn in waves of ``num_envs``: all generate, then all step."""
    width = setup.venv.num_envs
    for first in range(0, len(rollouts), width):
        active = list(enumerate(rollouts[first : first + width]))
        await asyncio.gather(*(_start(setup, r, i) for i, r in active))
        while active:
            generations = await asyncio.gather(*(_generate(setup, r) for _, r in active))
            await asyncio.gather(
                *(
                    _step(setup, r, i, g) if g is not None else _end_at_context_limit(setup, r, i)
                    for (i, r), g in zip(active, generations)
                )
            )
            for _, r in active:
                if r.done:
                    yield r
            active = [(i, r) for i, r in active if not r.done]


# ------------------------------------------------------------------ public API


async def stream(
    engine: RolloutEngine,
    venv: ToolVectorEnv,
    tasks: Sequence[Task | str],
    *,
    n_samples: int = 1,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    mode: str = "async",
    max_context: int | None = None,
    only: Collection[int] | None = None,
) -> AsyncIterator[Trajectory]:
    """Play ``n_samples`` episodes of every task; yield each trajectory as it finishes.

    Same arguments as :func:`collect`. Trajectories come in completion order
    (``metadata["rollout_index"]`` gives their place in :func:`collect`'s order).
    ``only``: play just these rollout indices (``task_index * n_samples + sample``),
    each exactly as it would be played in the full collection (its seeds depend on its
    index alone): what an evaluation resumed after a crash needs.
    """
    setup, rollouts = _plan(engine, venv, tasks, n_samples, sampling, seed, mode, max_context)
    if only is not None:
        wanted = set(only)
        rollouts = [r for r in rollouts if r.index in wanted]
    schedule = _async_schedule if mode == "async" else _sync_schedule
    async for r in schedule(setup, rollouts):
        yield r.to_trajectory()


async def collect(
    engine: RolloutEngine,
    venv: ToolVectorEnv,
    tasks: Sequence[Task | str],
    *,
    n_samples: int = 1,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    mode: str = "async",
    max_context: int | None = None,
) -> list[Trajectory]:
    """Play ``n_samples`` episodes of every task and return their trajectories.

    Args:
        engine: the policy; its ``generate`` gets the whole context so far.
        venv: the envs to play in (any number of sub-envs >= 1; see the module
            docstring for how they are shared).
        tasks: :class:`Task` objects (run inline) or task ids of the env's source.
        n_samples: episodes per task; they share a ``group_id``.
        sampling: per-turn sampling params; the env's ``stop_strings`` are
            appended to ``sampling.stop``, and ``sampling.seed`` is replaced by
            a seed derived from ``(seed, trajectory, turn)``.
        seed: makes the collection reproducible (with a deterministic engine).
        mode: ``"async"`` (trajectory-level) or ``"sync"`` (turn-by-turn batch
            baseline).
        max_context: the most tokens the engine may ever be given plus asked to
            generate: ``max_new_tokens`` is capped to the room left, and a
            trajectory with no room left ends ``truncated`` with
            ``metadata["truncation"] == "max_context"``. ``None``: no cap
            beyond the env's own ``max_episode_tokens``.

    Returns:
        ``len(tasks) * n_samples`` trajectories, task-major
        (``[task0/sample0, task0/sample1, ..., task1/sample0, ...]``); group id
        ``k`` is the ``k``-th task. ``reward`` is the episode's summed reward,
        ``reward_parts`` its final breakdown; tool statistics come from the
        env's ``info``; ``metadata`` holds the sample index, the sub-env that
        ran it, the truncation reason and wall-clock timings.
    """
    trajectories = [
        t
        async for t in stream(
            engine,
            venv,
            tasks,
            n_samples=n_samples,
            sampling=sampling,
            seed=seed,
            mode=mode,
            max_context=max_context,
        )
    ]
    return sorted(trajectories, key=lambda t: t.metadata["rollout_index"])


def _plan(
    engine: RolloutEngine,
    venv: ToolVectorEnv,
    tasks: Sequence[Task | str],
    n_samples: int,
    sampling: SamplingParams | None,
    seed: int,
    mode: str,
    max_context: int | None,
) -> tuple[_Setup, list[_Rollout]]:
    """Validate the arguments; build the shared setup and one rollout per (task, sample)."""
    if mode not in ROLLOUT_MODES:
        raise InvalidConfigError(f"mode must be one of {list(ROLLOUT_MODES)}, got {mode!r}")
    if not isinstance(n_samples, int) or n_samples < 1:
        raise InvalidConfigError(f"n_samples must be an int >= 1, got {n_samples!r}")
    if max_context is not None and max_context < 1:
        raise InvalidConfigError(f"max_context must be >= 1 or None, got {max_context!r}")
    if not tasks:
        raise InvalidConfigError("collect() needs at least one task; got an empty sequence")
    sampling = sampling or SamplingParams()
    sampling = replace(sampling, stop=merge_stop_strings(sampling.stop, venv.stop_strings))
    setup = _Setup(engine, venv, sampling, int(seed), max_context)
    rollouts = [
        _Rollout(index=t * n_samples + s, task=task, group_id=t, sample=s)
        for t, task in enumerate(tasks)
        for s in range(n_samples)
    ]
    return setup, rollouts
