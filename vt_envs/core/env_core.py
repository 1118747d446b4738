"""The async core of :class:`~vt_envs.core.env.ToolEnv`: one episode, turn by turn.

:class:`ToolEnvCore` holds what happens in an episode: :meth:`~ToolEnvCore.areset`
draws a task, encodes the prompt and opens the tools' sessions;
:meth:`~ToolEnvCore.astep` reads an action, runs its calls or grades its answer
and encodes the next observation; :meth:`~ToolEnvCore.atruncate` and the env's
budgets end the episode; :meth:`~ToolEnvCore.aclose` releases everything. The
behaviour each returns is documented on :class:`~vt_envs.core.env.ToolEnv`,
which configures it and adds the sync Gymnasium methods.

It delegates to the episode's pieces: :mod:`vt_envs.core.episode` (state,
sessions, budgets), :mod:`vt_envs.core.tool_calls`, :mod:`vt_envs.core.reward`,
:mod:`vt_envs.core.images` and :mod:`vt_envs.core.actions`.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from vt_envs.core.actions import MAX_TEXT_CHARS, decode_action
from vt_envs.core.episode import (
    Episode,
    OpenSessions,
    budget_exhausted,
    tool_calls_left,
    turn_limit,
)
from vt_envs.core.image_tokens import ImageTokens
from vt_envs.core.images import (
    collapse_images,
    count_image_tokens,
    place_images,
    public_message,
    task_images_of,
)
from vt_envs.core.observation_encoder import ObservationEncoder
from vt_envs.core.parser import ActionParser, ParseResult
from vt_envs.core.reward import RewardConfig, reward_parts, verify
from vt_envs.core.task import Task, TaskSource
from vt_envs.core.tokenizer import ChatTokenizer
from vt_envs.core.tool import Tool
from vt_envs.core.tool_calls import cap_observation, invalid_feedback, run_calls
from vt_envs.core.verifier import Score, Verifier
from vt_envs.errors import EnvClosedError, InvalidConfigError, ResetNeededError

__all__ = ["ToolEnvCore"]

StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]


class ToolEnvCore(gym.Env[dict, str]):
    """The async episode machinery of :class:`~vt_envs.core.env.ToolEnv` (never made
    on its own).

    Contract: the subclass's ``__init__`` sets every attribute annotated below,
    validated, before any method here runs; the ``max_*`` budgets,
    ``verify_timeout_s`` and ``verifier`` are read when used, so the env's current
    values always apply. ``_step_limit`` is Gymnasium's ``max_episode_steps``
    (``None``: none). ``_live`` holds the running episode's sessions, apart from
    the env so that ``_finalizer`` can close them when the env is dropped.
    """

    name: str
    tools: dict[str, Tool]
    tasks: TaskSource
    verifier: Verifier
    tokenizer: ChatTokenizer
    encoder: ObservationEncoder
    parser: ActionParser
    system_prompt: str
    example_messages: list[dict[str, str]]
    rewards: RewardConfig
    max_turns: int
    max_tool_calls: int | None
    max_episode_tokens: int
    max_episode_seconds: float | None
    max_observation_tokens: int
    max_image_tokens: int | None
    verify_timeout_s: float | None
    remind_turns_left: bool
    grade_truncated: bool
    task_images: Callable[[Task], Sequence[np.ndarray]] | None
    image_tokens: ImageTokens | None
    _answer_tag: str
    _episode: Episode | None
    _transcript: list[str]
    _closed: bool
    _step_limit: int | None
    _live: OpenSessions
    _finalizer: weakref.finalize

    # ------------------------------------------------------------------ API

    @property
    def task(self) -> Task | None:
        """The current episode's task (privileged: holds the gold; for oracles)."""
        return self._episode.task if self._episode else None

    @property
    def answer_tag(self) -> str:
        """The tag the agent's final answer goes in (``answer``; ``submit`` on VT-SWE-v0)."""
        return self._answer_tag

    async def areset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; see :meth:`reset`."""
        self._ensure_open()
        super().reset(seed=seed)
        task = self._choose_task(options or {})
        # Drawn after the task, and whatever the tools: seeding never changes the task sequence.
        session_seed = int(self.np_random.integers(1 << 31))
        if self._episode is not None:
            self._episode.done = True
        await self._live.aclose()
        images = task_images_of(task, self.task_images)
        messages = [
            {"role": "system", "content": self.system_prompt},
            *(dict(m) for m in self.example_messages),
            {"role": "user", "content": place_images(task.prompt, len(images))},
        ]
        ids, text = self.encoder.encode_prompt(messages, images=images)
        image_tokens = count_image_tokens(images, self.image_tokens)
        if self.max_image_tokens is not None and sum(image_tokens) > self.max_image_tokens:
            raise InvalidConfigError(
                f"task {task.id!r} has images of {sum(image_tokens)} tokens, over "
                f"max_image_tokens={self.max_image_tokens}; raise the budget or lower the "
                "processor's max_pixels"
            )
        await self._live.open(task, session_seed)
        episode = Episode(task, time.monotonic(), tokens=len(ids), messages=messages)
        episode.locks = {n: asyncio.Lock() for n, t in self.tools.items() if not t.concurrent_calls}
        episode.images, episode.image_tokens = list(images), sum(image_tokens)
        self._episode = episode
        self._transcript = [self._display(text)]
        public = [public_message(m, 0) for m in messages]
        info = self._info(parse=None, messages=public)
        if self.image_tokens is not None:
            info["image_tokens"] = image_tokens
        return self._observation(ids, text, images), info

    async def astep(self, action: str | Sequence[int] | np.ndarray) -> StepResult:
        """Advance one turn; see :meth:`step`."""
        episode = self._ensure_running()
        room = self.max_episode_tokens - episode.tokens
        text, ended_with_eos, n_action_tokens = decode_action(
            action, self.tokenizer, room, MAX_TEXT_CHARS
        )
        self._transcript.append(text)
        episode.turn += 1
        episode.tokens += n_action_tokens
        content = text.removesuffix(self.tokenizer.eos_token) if ended_with_eos else text
        episode.messages.append({"role": "assistant", "content": content})
        if n_action_tokens > room:  # it cannot fit: not parsed, not run, not graded
            return await self._finish(None, None, truncated=True, reason="max_episode_tokens")
        parse = self.parser.parse(text)
        info_extra: dict[str, Any] = {}

        if parse.kind == "answer":
            score = await self._verify(episode.task, parse.answer or "")
            return await self._finish(parse, score, truncated=False)

        images: list[np.ndarray] = []
        spent: str | None = None
        if parse.kind == "tool_call" and tool_calls_left(episode, self.max_tool_calls) > 0:
            feedback, results, images = await run_calls(
                episode,
                parse.calls,
                tools=self.tools,
                live=self._live,
                max_tool_calls=self.max_tool_calls,
                max_episode_seconds=self.max_episode_seconds,
                cap=self._cap_observation,
                image_env=self.image_tokens is not None,
            )
            info_extra["tool"] = results[0]
            if len(results) > 1:
                info_extra["tools"] = results
            spent = next((r["ends_episode"] for r in results if "ends_episode" in r), None)
        else:
            episode.invalid_actions += 1
            feedback = invalid_feedback(parse, self.max_tool_calls, self._answer_tag)
        if spent is not None:  # a tool's episode-wide limit (e.g. a disk quota) was passed
            return await self._finish(
                parse, None, truncated=True, reason=spent, info_extra=info_extra
            )
        image_tokens = count_image_tokens(images, self.image_tokens)
        if (
            self.max_image_tokens is not None
            and episode.image_tokens + sum(image_tokens) > self.max_image_tokens
        ):
            return await self._finish(
                parse, None, truncated=True, reason="max_image_tokens", info_extra=info_extra
            )

        truncation = budget_exhausted(
            episode,
            max_turns=self.max_turns,
            step_limit=self._step_limit,
            max_episode_tokens=self.max_episode_tokens,
            max_episode_seconds=self.max_episode_seconds,
        )
        if truncation:
            return await self._finish(
                parse, None, truncated=True, reason=truncation, info_extra=info_extra
            )
        if self.remind_turns_left:
            left = self._turn_limit() - episode.turn
            feedback += f"\n({left} turn{'s' if left != 1 else ''} left)"
        ids, obs_text = self.encoder.encode_observation(
            feedback,
            history=episode.messages,
            action_ended_with_eos=ended_with_eos,
            images=images,
        )
        episode.tokens += len(ids)
        if episode.tokens > self.max_episode_tokens:
            return await self._finish(
                parse, None, truncated=True, reason="max_episode_tokens", info_extra=info_extra
            )
        message = {"role": self.encoder.observation_role, "content": feedback}
        info_extra["message"] = public_message(message, len(episode.images))
        episode.messages.append(message)
        episode.images += images
        episode.image_tokens += sum(image_tokens)
        if self.image_tokens is not None:
            info_extra["image_tokens"] = image_tokens
        self._transcript.append(self._display(obs_text))
        observation = self._observation(ids, obs_text, images)
        return observation, 0.0, False, False, self._info(parse, **info_extra)

    def empty_observation(self) -> dict[str, Any]:
        """The observation of a final step: no ids, no text, no images."""
        return self._observation(np.zeros(0, dtype=np.int64), "")

    async def aclose(self) -> None:
        """Close open sessions and tools; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        if self._episode is not None:
            self._episode.done = True
            self._episode.images = []  # a closed env holds no image (render: BLANK_FRAME)
        await self._live.aclose_all()

    async def atruncate(self, reason: str) -> StepResult:
        """End the running episode now, truncated for ``reason`` (a budget the
        caller keeps, such as a trainer's context limit).

        Returns the final step's ``(observation, reward, terminated, truncated,
        info)``, exactly as when one of the env's own budgets runs out: the
        sessions are closed, shaping (``missing_answer_penalty``...) applies,
        and ``info`` has ``reward_parts`` and ``truncation == reason``.
        """
        self._ensure_running()
        return await self._finish(None, None, truncated=True, reason=reason)

    async def abandon_episode(self) -> None:
        """End the running episode without a result, closing its sessions (a vector
        env does this to a sub-env whose step raised)."""
        if self._episode is not None:
            self._episode.done = True
        await self._live.aclose()

    # ------------------------------------------------------------ internals

    def _ensure_open(self) -> None:
        if self._closed:
            raise EnvClosedError(f"{self.name} is closed; create a new env with gym.make(...)")

    def _ensure_running(self) -> Episode:
        self._ensure_open()
        if self._episode is None or self._episode.done:
            state = "before reset()" if self._episode is None else "after the episode ended"
            raise ResetNeededError(f"step() was called {state}; call reset() to start an episode.")
        return self._episode

    def _choose_task(self, options: Mapping[str, Any]) -> Task:
        if "task" in options:
            task = options["task"]
            if not isinstance(task, Task):
                raise InvalidConfigError(
                    f"options['task'] must be a vt_envs.Task, got {type(task).__name__}"
                )
            return task
        if "task_id" in options:
            return self.tasks.get(str(options["task_id"]))
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    async def _verify(self, task: Task, answer: str) -> Score:
        """The verifier's score, under the verification deadline (overrun: 0)."""
        return await verify(
            self.verifier,
            task,
            answer,
            timeout_s=self.verify_timeout_s,
            tools=self.tools,
            sessions=self._live.sessions,
        )

    def _cap_observation(self, text: str) -> str:
        return cap_observation(text, self.tokenizer, self.max_observation_tokens)

    def _turn_limit(self) -> int:
        return turn_limit(self.max_turns, self._step_limit)

    async def _finish(
        self,
        parse: ParseResult | None,
        score: Score | None,
        *,
        truncated: bool,
        reason: str | None = None,
        info_extra: Mapping[str, Any] | None = None,
    ) -> StepResult:
        episode = self._episode
        assert episode is not None
        episode.done = True
        if truncated and score is None and self.grade_truncated:
            # Graded as it stands (an SWE agent's unsubmitted fix), before the sessions close.
            score = await self._verify(episode.task, "")
        await self._live.aclose()
        parts = reward_parts(self.rewards, episode, score)
        reward = float(sum(parts.values()))
        info = self._info(parse, **(info_extra or {}))
        info["reward_parts"] = parts
        if score is not None:
            info["verifier_parts"] = dict(score.parts)
        if truncated:
            info["truncation"] = reason
        return self.empty_observation(), reward, not truncated, truncated, info

    def _observation(
        self, ids: np.ndarray, text: str, images: Sequence[np.ndarray] = ()
    ) -> dict[str, Any]:
        observation = {"tokens": np.asarray(ids, dtype=np.int64).copy(), "text": text}
        if self.image_tokens is not None:
            observation["images"] = tuple(images)
        return observation

    def _display(self, text: str) -> str:
        """``text`` for the ansi transcript: each expanded image back to its placeholder."""
        return collapse_images(text, self.image_tokens)

    def _info(self, parse: ParseResult | None, **extra: Any) -> dict[str, Any]:
        episode = self._episode
        assert episode is not None
        info = {
            "task_id": episode.task.id,
            "turn": episode.turn,
            "parse": parse.to_info() if parse is not None else None,
            "tool_calls": episode.tool_calls,
            "tool_errors": episode.tool_errors,
            "invalid_actions": episode.invalid_actions,
            "episode_tokens": episode.tokens,
        }
        if self.image_tokens is not None:
            info["image_tokens"] = []
            info["episode_image_tokens"] = episode.image_tokens
        info.update(extra)
        return info
