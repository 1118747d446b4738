"""VT envs in TRL: train on ``gym.make("VT-...")`` with TRL's own ``GRPOTrainer``.

The hook is the one TRL 1.x documents for custom multi-turn rollouts:
``GRPOTrainer(..., rollout_func=...)``. TRL calls ``rollout_func(prompts, trainer)`` with
the prompts of its generation batch (each prompt already repeated ``num_generations``
times) and reads back, per prompt, ``prompt_ids``, ``completion_ids`` and ``logprobs``;
an ``env_mask`` (1 on tokens the policy generated, 0 on tokens the environment wrote)
becomes its ``tool_mask``, which it multiplies into the loss mask; every other key is
handed to the reward functions as a keyword argument.

:class:`VTRollout` is that ``rollout_func``. It plays one VT episode per prompt with
VT's own rollout loop (:func:`vt_train.rollout.collect`), so the ids are VT's, token-in /
token-out, never re-tokenized::

    prompt_ids      = the env's reset observation ids (system prompt ... assistant header)
    completion_ids  = action_1 + obs_1 + action_2 + ... + action_n   (the episode's ids)
    env_mask        = 1 on action ids (sampled by the policy), 0 on observation ids
    logprobs        = the sampling logprob of each action id, 0.0 on observation ids
    env_reward      = the episode's reward from the env (verifier + RewardConfig shaping)

and :func:`env_reward` is the reward function that hands the env's reward to TRL.

Generation: each turn is sampled from the trainer's own model (unwrapped with TRL's
``unwrap_model_for_generation``, with TRL's ``generation_config``: ``temperature``,
``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` of the ``GRPOConfig``) by
``transformers``' ``generate``, batched across the episodes waiting for a turn
(:class:`TrainerEngine`). TRL's own generation method (``GRPOTrainer._generate_single_turn``)
is not used: it is private, single-turn, cannot stop at the env's stop strings (it passes
no tokenizer to ``generate``) and returns no logprobs without vLLM. VT's envs also are not
plugged in through ``environment_factory``: there TRL parses tool calls and renders tool
results through the chat template itself, so the observation ids would be TRL's, not the
env's.

Usage::

    from trl import GRPOConfig, GRPOTrainer
    from vt_train.integrations.trl import VTRollout, env_reward

    rollout = VTRollout("VT-Lookup-v0", env_kwargs={"max_turns": 4})
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=GRPOConfig(...),
        train_dataset=rollout.dataset(1000), reward_funcs=env_reward, rollout_func=rollout,
    )
    trainer.train()
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vt_envs.core.task import Task
from vt_envs.core.tokenizer import ChatTokenizer, load_tokenizer
from vt_envs.errors import InvalidConfigError
from vt_train.engines.base import (
    FinishReason,
    Generation,
    RolloutEngine,
    SamplingParams,
    StopChecker,
    reject_images,
)
from vt_train.trajectory import Trajectory

__all__ = ["TrainerEngine", "VTRollout", "env_reward", "trajectories_to_trl"]


def env_reward(*, env_reward: Sequence[float], **_: Any) -> list[float]:
    """A TRL reward function: each episode's reward as the env gave it.

    :class:`VTRollout` returns the rewards under the ``env_reward`` key; TRL passes that
    extra field to every reward function. Logged by TRL as ``rewards/env_reward/mean``.
    """
    return [float(r) for r in env_reward]


def trajectories_to_trl(trajectories: Sequence[Trajectory], eos_token_id: int) -> dict[str, list]:
    """VT trajectories as the dict a TRL ``rollout_func`` returns (see the module docstring).

    Also returns ``vt_task_id`` and ``vt_reward_parts`` (the env's reward breakdown) for
    reward functions that want them. An episode that ended before the policy generated
    anything (its prompt filled the context budget) gets one eos id, masked out, since
    TRL needs a non-empty completion.
    """
    out: dict[str, list] = {
        "prompt_ids": [],
        "completion_ids": [],
        "logprobs": [],
        "env_mask": [],
        "env_reward": [],
        "vt_task_id": [],
        "vt_reward_parts": [],
    }
    for t in trajectories:
        cut = t.prompt_length
        completion = list(t.input_ids[cut:])
        mask = list(t.loss_mask[cut:])
        logprobs = list(t.rollout_logprobs[cut:])
        if not completion:
            completion, mask, logprobs = [int(eos_token_id)], [0], [0.0]
        out["prompt_ids"].append(list(t.input_ids[:cut]))
        out["completion_ids"].append(completion)
        out["logprobs"].append(logprobs)
        out["env_mask"].append(mask)
        out["env_reward"].append(float(t.reward))
        out["vt_task_id"].append(t.task_id)
        out["vt_reward_parts"].append(dict(t.reward_parts))
    return out


# ------------------------------------------------------------------ engine


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


def _batch_key(params: SamplingParams) -> tuple:
    return params.max_new_tokens, params.temperature, params.top_p, params.stop


class _StopStrings:
    """A ``transformers`` stopping criterion on VT's :class:`StopChecker`; records where
    each row first hit a stop string (the hit's token is kept, as VT's engines do)."""

    def __init__(self, checker: StopChecker, prompt_width: int, rows: int):
        self.checker = checker
        self.width = prompt_width
        self.ends: list[int | None] = [None] * rows

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        generated = input_ids[:, self.width :]
        for i in range(generated.shape[0]):
            if self.ends[i] is None and self.checker.hit(generated[i].tolist()):
                self.ends[i] = generated.shape[1]
        done = [end is not None for end in self.ends]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class TrainerEngine(RolloutEngine):
    """A :class:`RolloutEngine` on a TRL trainer's own model, for :class:`VTRollout`.

    Requests that are waiting together (every episode's next turn, in ``mode="sync"``)
    are left-padded into one ``generate`` call with the trainer's ``generation_config``
    (``max_new_tokens``, ``temperature`` and ``top_p`` from the request); generation stops
    at eos or at one of the request's stop strings. Logprobs are those of the sampling
    distribution (the generation scores after temperature / top-k / top-p). Per-request
    seeds are not honoured: sampling draws from torch's RNG, which the trainer seeds.
    """

    def __init__(self, trainer: Any, tokenizer: ChatTokenizer, *, max_batch_size: int = 64):
        if max_batch_size < 1:
            raise InvalidConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.trainer = trainer
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] = []
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, images: Sequence[Any] = ()
    ) -> Generation:
        reject_images(self, images)
        if len(prompt_ids) == 0:
            raise InvalidConfigError("TrainerEngine.generate needs a non-empty prompt")
        loop = asyncio.get_running_loop()
        request = _Request([int(t) for t in prompt_ids], params, loop.create_future())
        self._pending.append(request)
        worker = self._worker
        if worker is None or worker.done() or worker.get_loop() is not loop:
            self._worker = loop.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        await asyncio.sleep(0)  # requests issued together (a sync turn) join this batch
        while self._pending:
            key = _batch_key(self._pending[0].params)
            batch = [r for r in self._pending if _batch_key(r.params) == key]
            batch = batch[: self.max_batch_size]
            self._pending = [r for r in self._pending if r not in batch]
            try:
                results = await asyncio.to_thread(
                    self._generate_batch, [r.prompt_ids for r in batch], batch[0].params
                )
            except BaseException as exc:
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for r, result in zip(batch, results):
                if not r.future.done():
                    r.future.set_result(result)

    def _generation_config(self, params: SamplingParams) -> Any:
        config = copy.deepcopy(self.trainer.generation_config)
        config.max_new_tokens = params.max_new_tokens
        config.return_dict_in_generate = True
        config.output_scores = True
        if params.temperature == 0:
            config.do_sample = False
            config.temperature = None
            config.top_p = None
            config.top_k = None
        else:
            config.do_sample = True
            config.temperature = params.temperature
            config.top_p = params.top_p
        config.pad_token_id = self.tokenizer.pad_token_id
        return config

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        from transformers import StoppingCriteriaList
        from trl.models import unwrap_model_for_generation

        trainer = self.trainer
        device = trainer.accelerator.device
        self.batch_sizes.append(len(prompts))
        if params.max_new_tokens == 0:
            return [Generation([], [], "length") for _ in prompts]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        config = self._generation_config(params)
        checker = StopChecker(params.stop, self.tokenizer.decode)
        stop = _StopStrings(checker, width, len(prompts)) if checker else None
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                generation_kwargs=getattr(trainer, "generation_kwargs", None),
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=config,
                stopping_criteria=StoppingCriteriaList([stop]) if stop is not None else None,
            )
        sequences = out.sequences[:, width:].cpu()
        eos = config.eos_token_id
        eos_ids = {self.tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
        eos_ids.discard(None)
        ends: list[tuple[int, FinishReason]] = []
        for i in range(len(prompts)):
            row = sequences[i].tolist()
            end, reason = len(row), "length"
            first_eos = next((k for k, t in enumerate(row) if t in eos_ids), None)
            if first_eos is not None:
                end, reason = first_eos + 1, "eos"
            if stop is not None and stop.ends[i] is not None and stop.ends[i] < end:
                end, reason = stop.ends[i], "stop"
            ends.append((end, reason))
        logprobs: list[list[float]] = [[] for _ in prompts]
        longest = max(end for end, _ in ends)
        for step in range(min(longest, len(out.scores))):
            step_logprobs = torch.log_softmax(out.scores[step].float(), dim=-1).cpu()
            for i, (end, _) in enumerate(ends):
                if step < end:
                    logprobs[i].append(float(step_logprobs[i, sequences[i, step]]))
        return [
            Generation(sequences[i, :end].tolist(), logprobs[i], reason)
            for i, (end, reason) in enumerate(ends)
        ]

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Nothing to load: the engine generates with the trainer's model itself."""

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        raise NotImplementedError("TrainerEngine does not score sequences; TRL does")


# ------------------------------------------------------------------ rollout_func


def _prompt_key(prompt: Any) -> str:
    """What identifies a dataset prompt when TRL hands it back (``None`` fields dropped:
    ``datasets`` fills a message's missing keys with ``None``)."""
    if isinstance(prompt, str):
        return prompt
    messages = [{k: v for k, v in dict(m).items() if v is not None} for m in prompt]
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


class VTRollout:
    """A TRL ``GRPOTrainer`` ``rollout_func`` that plays VT episodes (see the module docstring).

    Args:
        env_id: a registered VT env id (``"VT-Lookup-v0"``); each sub-env is
            ``gym.make(env_id, split=split, tokenizer=..., **env_kwargs)``.
        env_kwargs: the env's keyword arguments (``max_turns``, ``rewards``, ...).
        split: the task split the episodes (and :meth:`dataset`) draw from.
        tokenizer: the env's tokenizer (anything ``gym.make`` takes); default: the
            trainer's ``processing_class``, which must be the policy's tokenizer.
        num_envs: sub-envs played at once (episodes beyond that wait for a free one).
        max_new_tokens: the most ids one turn may generate; default: the trainer's
            ``max_completion_length``. (TRL's ``max_completion_length`` does not bound
            a whole episode's completion: use ``max_context`` or the env's budgets.)
        max_context: the most ids an episode may hold (prompt + completion); ``None``:
            the env's ``max_episode_tokens`` alone.
        mode: ``"sync"`` (every episode's turn generated in one batch, the default) or
            ``"async"`` (:func:`vt_train.rollout.collect`'s modes).
        seed: seeds the env resets (each call of the rollout uses a new derived seed).
        max_batch_size: the most episodes one ``generate`` call serves.

    Attributes:
        last_trajectories: the trajectories of the latest call, in the prompts' order.
        calls: how many times TRL called the rollout.
    """

    def __init__(
        self,
        env_id: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        split: str = "train",
        tokenizer: Any = None,
        num_envs: int = 8,
        max_new_tokens: int | None = None,
        max_context: int | None = None,
        mode: str = "sync",
        seed: int = 0,
        max_batch_size: int = 64,
    ):
        if num_envs < 1:
            raise InvalidConfigError(f"num_envs must be >= 1, got {num_envs}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.split = split
        self.tokenizer_spec = tokenizer
        self.num_envs = num_envs
        self.max_new_tokens = max_new_tokens
        self.max_context = max_context
        self.mode = mode
        self.seed = int(seed)
        self.max_batch_size = max_batch_size
        self.last_trajectories: list[Trajectory] = []
        self.calls = 0
        self._task_of_prompt: dict[str, str] = {}
        self._trainer: Any = None
        self._venv: Any = None
        self._engine: TrainerEngine | None = None
        self._tokenizer: ChatTokenizer | None = None

    # -- the dataset TRL iterates ------------------------------------------------

    def dataset(self, size: int | None = None, *, task_ids: Sequence[str] | None = None) -> Any:
        """A ``datasets.Dataset`` of the env's tasks for ``GRPOTrainer(train_dataset=...)``.

        Each row: ``prompt`` (the env's prompt as chat messages: system prompt, worked
        examples, the task) and ``task_id``. TRL passes only ``prompt`` to the rollout,
        so this object remembers which task each prompt is; a plain-string prompt that
        is a task id of the split works too. ``size``: the split's first ``size`` tasks
        (default all); ``task_ids``: these tasks instead.
        """
        import datasets
        import gymnasium as gym

        env = gym.make(
            self.env_id, split=self.split, tokenizer=self.tokenizer_spec, **self.env_kwargs
        )
        try:
            tasks = env.unwrapped.tasks
            if task_ids is None:
                count = len(tasks) if size is None else min(int(size), len(tasks))
                task_ids = [tasks[i].id for i in range(count)]  # by index: no whole-split scan
            rows = []
            for task_id in task_ids:
                _, info = env.reset(options={"task_id": task_id})
                prompt = [dict(m) for m in info["messages"]]
                self._task_of_prompt.setdefault(_prompt_key(prompt), str(task_id))
                rows.append({"prompt": prompt, "task_id": str(task_id)})
        finally:
            env.close()
        return datasets.Dataset.from_list(rows)

    def _task(self, prompt: Any) -> str:
        key = _prompt_key(prompt)
        task_id = self._task_of_prompt.get(key)
        if task_id is not None:
            return task_id
        if isinstance(prompt, str):
            tasks = self._venv.envs[0].unwrapped.tasks
            if tasks.find(prompt) is not None:
                return prompt
        raise InvalidConfigError(
            f"VTRollout: a prompt is not one of this rollout's tasks ({str(prompt)[:120]!r}); "
            "build train_dataset with VTRollout.dataset(), or make each prompt a task id of "
            f"{self.env_id}'s {self.split!r} split"
        )

    # -- the rollout_func --------------------------------------------------------

    def _setup(self, trainer: Any) -> None:
        if self._trainer is trainer:
            return
        import gymnasium as gym

        from vt_envs.vector import ToolVectorEnv

        vllm = getattr(trainer, "use_vllm", False)
        if vllm or getattr(trainer, "generation_config", None) is None:
            raise InvalidConfigError(
                "VTRollout generates with the trainer's model through transformers; make the "
                "GRPOTrainer with use_vllm=False"
            )
        self.close()
        spec = self.tokenizer_spec if self.tokenizer_spec is not None else trainer.processing_class
        tokenizer = getattr(spec, "tokenizer", spec)  # a processor's tokenizer
        self._tokenizer = load_tokenizer(tokenizer)
        self._venv = ToolVectorEnv(
            [
                gym.make(self.env_id, split=self.split, tokenizer=tokenizer, **self.env_kwargs)
                for _ in range(self.num_envs)
            ]
        )
        self._engine = TrainerEngine(trainer, self._tokenizer, max_batch_size=self.max_batch_size)
        self._trainer = trainer

    def sampling(self, trainer: Any) -> SamplingParams:
        """One turn's sampling: ``max_new_tokens`` (default ``max_completion_length``),
        ``temperature`` and ``top_p`` of the trainer's ``GRPOConfig``."""
        args = trainer.args
        return SamplingParams(
            max_new_tokens=int(self.max_new_tokens or args.max_completion_length),
            temperature=float(args.temperature),
            top_p=float(args.top_p),
        )

    def rollout(self, tasks: Sequence[Task | str], trainer: Any) -> list[Trajectory]:
        """Play one episode per task with the trainer's model; the trajectories in order."""
        from vt_envs.core.loop import run_sync
        from vt_train.rollout import collect

        self._setup(trainer)
        rank = int(getattr(trainer.accelerator, "process_index", 0))
        seed = self.seed * 100_003 + self.calls * 1_009 + rank * 7_919
        self.calls += 1
        return run_sync(
            collect(
                self._engine,
                self._venv,
                list(tasks),
                n_samples=1,
                sampling=self.sampling(trainer),
                seed=seed,
                mode=self.mode,
                max_context=self.max_context,
            ),
            method="VTRollout",
            async_method="vt_train.rollout.collect",
        )

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """TRL's ``rollout_func(prompts, trainer)``: one episode per prompt."""
        self._setup(trainer)
        trajectories = self.rollout([self._task(p) for p in prompts], trainer)
        self.last_trajectories = trajectories
        return trajectories_to_trl(trajectories, self._tokenizer.eos_token_id)

    def close(self) -> None:
        """Close the sub-envs (a later call makes new ones)."""
        if self._venv is not None:
            self._venv.close()
        self._venv = self._engine = self._trainer = None
