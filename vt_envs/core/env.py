"""ToolEnv: the generic episode of an LLM agent that uses tools.

A domain env (SQL, math, ...) is a *configuration* of :class:`ToolEnv` —
tools + task source + verifier + instructions + budgets — registered under an
id; a benchmark author writes no env class.

The core is async (:meth:`ToolEnv.areset`, :meth:`ToolEnv.astep`,
:meth:`ToolEnv.aclose`); the Gymnasium methods ``reset``/``step``/``close``
run those coroutines on the library's long-lived event loop
(:mod:`vt_envs.core.loop`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from vt_envs.core.loop import run_sync
from vt_envs.core.parser import ActionParser, ParseResult, ToolCall
from vt_envs.core.prompt import ACTION_FORMATS, render_system_prompt
from vt_envs.core.spaces import UnicodeText, token_sequence_space
from vt_envs.core.task import Task, TaskSource
from vt_envs.core.tokenizer import ChatTokenizer, ObservationEncoder, load_tokenizer
from vt_envs.core.tool import Tool, ToolResult
from vt_envs.core.verifier import Score, Verifier
from vt_envs.errors import EnvClosedError, InvalidConfigError, ResetNeededError

__all__ = ["OBSERVATION_FORMATS", "RewardConfig", "ToolEnv"]

logger = logging.getLogger(__name__)

OBSERVATION_FORMATS = ("chat", "inline")
_MAX_TEXT_CHARS = 1 << 20


@dataclass(frozen=True)
class RewardConfig:
    """Optional reward shaping, added to the verifier's outcome on the final step.

    All terms are off by default (outcome reward only). Each one that applies
    is reported separately in ``info["reward_parts"]``.

    Attributes:
        invalid_action_penalty: subtracted once per action the parser rejected
            (malformed call, unknown tool, no action).
        tool_error_penalty: subtracted once per tool call that failed (error,
            timeout) — ToRL's penalty for non-executable code.
        missing_answer_penalty: subtracted when the episode ends without an
            answer (truncated by a budget).
        max_penalty: cap on the total subtracted (so shaping never dominates
            the outcome), ``None`` for no cap.
    """

    invalid_action_penalty: float = 0.0
    tool_error_penalty: float = 0.0
    missing_answer_penalty: float = 0.0
    max_penalty: float | None = None

    def __post_init__(self) -> None:
        for name in ("invalid_action_penalty", "tool_error_penalty", "missing_answer_penalty"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(
                    f"RewardConfig.{name} is a penalty magnitude and must be >= 0, "
                    f"got {getattr(self, name)}; it is subtracted from the reward."
                )


@dataclass
class _Episode:
    """Mutable state of the running episode."""

    task: Task
    sessions: dict[str, Any]
    started: float
    tokens: int
    turn: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    invalid_actions: int = 0
    done: bool = False


class ToolEnv(gym.Env[dict, str]):
    """An episode in which an LLM agent calls tools and gives a final answer.

    Observation (a dict):
        ``tokens`` — ``np.ndarray[int64]``: the exact ids to append to the
        policy's context. On reset: the whole prompt, ending with the
        assistant header. On a step: the ids between this action and the next
        one (the turn boundary, the tool message, the next assistant header in
        the ``chat`` format; the wrapped tool output in ``inline``). On the
        final step: empty.
        ``text`` — the same observation as text (``tokenizer.decode(tokens)``).

    Action: the text the policy generated this turn (``str``), or its token ids
    (a 1-D integer array or list), which the env decodes. The env never
    re-tokenizes an action: the trainer keeps the ids it generated.

    Reward: 0 on every step but the last; on the last, the verifier's score of
    the model's own answer plus any shaping from :class:`RewardConfig`,
    broken down in ``info["reward_parts"]``.

    ``terminated``: the agent answered. ``truncated``: ``max_turns``,
    ``max_episode_tokens`` or ``max_episode_seconds`` ran out first.

    ``info`` always has ``task_id``, ``turn``, ``parse`` (``None`` on reset),
    ``tool_calls``, ``tool_errors``, ``invalid_actions``, ``episode_tokens``;
    ``tool`` (name, ok, error, latency_s) when a tool ran; ``reward_parts`` on
    the final step. For policies that work with chat messages rather than
    token ids (an OpenAI-compatible endpoint), ``info["messages"]`` on reset
    holds the prompt messages and ``info["message"]`` on each non-final step
    the env's new message (role and content, before templating).

    Policy mistakes (malformed calls, unknown tools, tool errors, timeouts)
    are observations the agent reads, never exceptions.

    Args:
        tools: the tools the agent may call (their sessions are opened at reset).
        tasks: the task source the env draws from with its seeded RNG.
        verifier: ``(task, answer_text) -> Score``.
        instructions: the domain's system-prompt text; tool descriptions and
            the answer format are appended.
        tokenizer: ``None`` (the shipped default), a Hugging Face tokenizer, a
            local path, or a :class:`ChatTokenizer`.
        observation_format: ``"chat"`` (tool output as a new message) or
            ``"inline"`` (inside the assistant turn, ToRL style).
        inline_template: how ``inline`` wraps tool output (``{text}``).
        action_format: how tool calls are described in the prompt: ``"tags"``
            or ``"json"``. The parser accepts both forms either way.
        max_turns: actions per episode before truncation.
        max_tool_calls: tool calls per episode; after that the env says so and
            only an answer is accepted. ``None``: no cap beyond ``max_turns``.
        max_calls_per_turn: tool calls run from one action (in parallel).
        max_episode_tokens: context budget (prompt + actions + observations).
        max_episode_seconds: wall-clock budget from reset; it also caps the
            time a tool call may take. ``None``: no wall-clock budget.
        max_observation_tokens: tool output longer than this is cut, with a
            note saying how much.
        answer_tags: tags that hold the final answer.
        boxed_answers: also accept the last ``\\boxed{...}`` as the answer.
        remind_turns_left: append "(N turns left)" to each observation.
        rewards: optional shaping (see :class:`RewardConfig`).
        render_mode: ``None`` or ``"ansi"`` (the transcript as text).
        name: a short label for reprs and logs.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        *,
        tools: Sequence[Tool],
        tasks: TaskSource,
        verifier: Verifier,
        instructions: str,
        tokenizer: Any = None,
        observation_format: str = "chat",
        inline_template: str = "\n<output>\n{text}\n</output>\n",
        action_format: str = "tags",
        max_turns: int = 8,
        max_tool_calls: int | None = None,
        max_calls_per_turn: int = 1,
        max_episode_tokens: int = 8192,
        max_episode_seconds: float | None = None,
        max_observation_tokens: int = 512,
        answer_tags: Sequence[str] = ("answer",),
        boxed_answers: bool = False,
        remind_turns_left: bool = False,
        rewards: RewardConfig | Mapping[str, float] | None = None,
        render_mode: str | None = None,
        name: str = "ToolEnv",
    ):
        _check_choice("observation_format", observation_format, OBSERVATION_FORMATS)
        _check_choice("action_format", action_format, ACTION_FORMATS)
        _check_choice("render_mode", render_mode, (None, *self.metadata["render_modes"]))
        for field_name, value in (
            ("max_turns", max_turns),
            ("max_calls_per_turn", max_calls_per_turn),
            ("max_episode_tokens", max_episode_tokens),
            ("max_observation_tokens", max_observation_tokens),
        ):
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"{field_name} must be an int >= 1, got {value!r}")
        if max_tool_calls is not None and max_tool_calls < 0:
            raise InvalidConfigError(f"max_tool_calls must be >= 0 or None, got {max_tool_calls}")
        if max_episode_seconds is not None and max_episode_seconds <= 0:
            raise InvalidConfigError(
                f"max_episode_seconds must be > 0 or None, got {max_episode_seconds}"
            )
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise InvalidConfigError(f"tool names must be unique, got {names}")
        if not isinstance(rewards, RewardConfig):
            rewards = RewardConfig(**dict(rewards or {}))

        self.name = name
        self.tools = {tool.name: tool for tool in tools}
        self.tasks = tasks
        self.verifier = verifier
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls
        self.max_episode_tokens = max_episode_tokens
        self.max_episode_seconds = max_episode_seconds
        self.max_observation_tokens = max_observation_tokens
        self.remind_turns_left = remind_turns_left
        self.rewards = rewards
        self.render_mode = render_mode
        self.observation_format = observation_format

        self.tokenizer: ChatTokenizer = load_tokenizer(tokenizer)
        self.encoder = ObservationEncoder(
            self.tokenizer, observation_format, inline_template=inline_template
        )
        self.parser = ActionParser(
            tools,
            answer_tags=answer_tags,
            boxed_answers=boxed_answers,
            max_calls=max_calls_per_turn,
        )
        self.system_prompt = render_system_prompt(
            instructions,
            tools,
            action_format=action_format,
            answer_tag=answer_tags[0],
            extra_answer_forms=("\\boxed{ANSWER}",) if boxed_answers else (),
        )
        self._answer_tag = answer_tags[0]
        self.stop_strings: tuple[str, ...] = self.parser.stop_strings
        """Strings at which a policy should stop generating so the env can act."""

        self.observation_space = gym.spaces.Dict(
            {
                "tokens": token_sequence_space(self.tokenizer.vocab_size),
                "text": UnicodeText(_MAX_TEXT_CHARS),
            }
        )
        self.action_space = UnicodeText(_MAX_TEXT_CHARS)

        self._episode: _Episode | None = None
        self._transcript: list[str] = []
        self._closed = False

    # ------------------------------------------------------------------ API

    @property
    def task(self) -> Task | None:
        """The current episode's task (privileged: holds the gold; for oracles)."""
        return self._episode.task if self._episode else None

    async def areset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; see :meth:`reset`."""
        self._ensure_open()
        super().reset(seed=seed)
        task = self._choose_task(options or {})
        await self._close_sessions()
        sessions = await self._open_sessions(task)
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        ids, text = self.encoder.encode_prompt(messages)
        self._episode = _Episode(task, sessions, time.monotonic(), tokens=len(ids))
        self._transcript = [text]
        return self._observation(ids, text), self._info(parse=None, messages=messages)

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode and return ``(observation, info)``.

        ``options`` may hold ``task_id`` (run that task of the source) or
        ``task`` (a :class:`Task` given inline); otherwise the next task is
        drawn with the env's seeded RNG: the same seed gives the same task
        sequence and the same observations.
        """
        return run_sync(
            self.areset(seed=seed, options=options), method="reset", async_method="areset"
        )

    async def astep(
        self, action: str | Sequence[int] | np.ndarray
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Advance one turn; see :meth:`step`."""
        episode = self._ensure_running()
        text, ended_with_eos, n_action_tokens = self._decode_action(action)
        self._transcript.append(text)
        episode.turn += 1
        episode.tokens += n_action_tokens
        parse = self.parser.parse(text)
        info_extra: dict[str, Any] = {}

        if parse.kind == "answer":
            # Off the event loop: a slow verifier (math-verify, SQL execution)
            # must not stall the other episodes sharing this loop.
            score = await asyncio.to_thread(self.verifier, episode.task, parse.answer or "")
            return await self._finish(parse, score, truncated=False, ended_with_eos=ended_with_eos)

        if parse.kind == "tool_call" and self._tool_budget_left(episode) > 0:
            feedback, results = await self._run_calls(episode, parse.calls)
            info_extra["tool"] = results[0]
            if len(results) > 1:
                info_extra["tools"] = results
        else:
            episode.invalid_actions += 1
            feedback = self._invalid_feedback(episode, parse)

        truncation = self._budget_exhausted(episode)
        if truncation:
            return await self._finish(
                parse,
                None,
                truncated=True,
                ended_with_eos=ended_with_eos,
                reason=truncation,
                info_extra=info_extra,
            )
        if self.remind_turns_left:
            left = self.max_turns - episode.turn
            feedback += f"\n({left} turn{'s' if left != 1 else ''} left)"
        ids, obs_text = self.encoder.encode_observation(
            feedback, action_ended_with_eos=ended_with_eos
        )
        episode.tokens += len(ids)
        if episode.tokens > self.max_episode_tokens:
            return await self._finish(
                parse,
                None,
                truncated=True,
                ended_with_eos=ended_with_eos,
                reason="max_episode_tokens",
                info_extra=info_extra,
            )
        self._transcript.append(obs_text)
        info_extra["message"] = {"role": self.encoder.observation_role, "content": feedback}
        return self._observation(ids, obs_text), 0.0, False, False, self._info(parse, **info_extra)

    def step(
        self, action: str | Sequence[int] | np.ndarray
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply one action; return ``(observation, reward, terminated, truncated, info)``.

        The action is parsed: an answer ends the episode (scored by the
        verifier); a tool call runs the tool (with its timeout) and its
        output becomes the observation; anything else becomes an observation
        explaining the expected format.
        """
        return run_sync(self.astep(action), method="step", async_method="astep")

    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the transcript so far (prompt, actions, observations)."""
        if self.render_mode == "ansi":
            return "".join(self._transcript)
        return None

    async def aclose(self) -> None:
        """Close open sessions and tools; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._close_sessions()
        await asyncio.gather(*(tool.aclose() for tool in self.tools.values()))

    def close(self) -> None:
        """Release sessions and tools (see :meth:`aclose`)."""
        if self._closed:
            return
        run_sync(self.aclose(), method="close", async_method="aclose")

    def __repr__(self) -> str:
        return (
            f"<ToolEnv {self.name!r} tools={list(self.tools)} tasks={self.tasks!r} "
            f"format={self.observation_format!r}>"
        )

    # ------------------------------------------------------------ internals

    def _ensure_open(self) -> None:
        if self._closed:
            raise EnvClosedError(f"{self.name} is closed; create a new env with gym.make(...)")

    def _ensure_running(self) -> _Episode:
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

    async def _open_sessions(self, task: Task) -> dict[str, Any]:
        names = list(self.tools)
        opened = await asyncio.gather(
            *(self.tools[n].open_session(task) for n in names), return_exceptions=True
        )
        failures = [o for o in opened if isinstance(o, BaseException)]
        if failures:
            sessions = {n: o for n, o in zip(names, opened) if not isinstance(o, BaseException)}
            await self._close(sessions)
            raise failures[0]
        return dict(zip(names, opened))

    async def _close_sessions(self) -> None:
        if self._episode is not None:
            sessions, self._episode.sessions = self._episode.sessions, {}
            await self._close(sessions)

    async def _close(self, sessions: Mapping[str, Any]) -> None:
        results = await asyncio.gather(
            *(self.tools[n].close_session(s) for n, s in sessions.items()),
            return_exceptions=True,
        )
        for name, result in zip(sessions, results):
            if isinstance(result, BaseException):
                logger.warning("closing the %s session failed: %r", name, result)

    def _decode_action(self, action: Any) -> tuple[str, bool, int]:
        """Return ``(text, ended_with_eos, token_count)`` of an action.

        Token ids are decoded (and counted as given). A text action is encoded
        only to count it against the token budget; training always uses the
        ids the policy generated, never these.
        """
        eos = self.tokenizer.eos_token
        if isinstance(action, str):
            return action, action.endswith(eos), len(self.tokenizer.encode(action))
        ids = np.asarray(action)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(
                f"action must be a str or a 1-D sequence of token ids, got {type(action).__name__}"
                f" with shape {ids.shape} and dtype {ids.dtype}"
            )
        ids_list = ids.tolist()
        ended = bool(ids_list) and ids_list[-1] == self.tokenizer.eos_token_id
        return self.tokenizer.decode(ids_list), ended, len(ids_list)

    def _tool_budget_left(self, episode: _Episode) -> int:
        if self.max_tool_calls is None:
            return 1 << 30
        return self.max_tool_calls - episode.tool_calls

    def _invalid_feedback(self, episode: _Episode, parse: ParseResult) -> str:
        if parse.kind == "tool_call":  # a valid call, but the tool budget is spent
            return (
                f"You have used all {self.max_tool_calls} tool calls. "
                f"Give your final answer now with <{self._answer_tag}>...</{self._answer_tag}>."
            )
        return parse.message or "Invalid action."

    async def _run_calls(
        self, episode: _Episode, calls: Sequence[ToolCall]
    ) -> tuple[str, list[dict[str, Any]]]:
        calls = list(calls)[: self._tool_budget_left(episode)]
        results = await asyncio.gather(*(self._run_call(episode, call) for call in calls))
        texts, infos = [], []
        for call, (result, latency) in zip(calls, results):
            episode.tool_calls += 1
            episode.tool_errors += not result.ok
            texts.append(self._cap_observation(result.text))
            infos.append(
                {
                    "name": call.name,
                    "ok": result.ok,
                    "error": result.error,
                    "latency_s": latency,
                    "metrics": dict(result.metrics),
                }
            )
        return "\n".join(texts), infos

    async def _run_call(self, episode: _Episode, call: ToolCall) -> tuple[ToolResult, float]:
        tool = self.tools[call.name]
        timeout = tool.timeout_s
        if self.max_episode_seconds is not None:
            remaining = self.max_episode_seconds - (time.monotonic() - episode.started)
            timeout = max(0.001, min(timeout, remaining))
        start = time.monotonic()
        try:
            result = await asyncio.wait_for(
                tool.call(episode.sessions.get(call.name), call.arguments), timeout
            )
        except (asyncio.TimeoutError, TimeoutError):
            result = ToolResult.failure(
                f"Error: the {call.name} call timed out after {timeout:.3g} s.", "timeout"
            )
        except Exception as exc:  # a tool bug must not end the agent's episode
            logger.exception("tool %s raised", call.name)
            result = ToolResult.failure(
                f"Error: the {call.name} tool failed ({type(exc).__name__}).", "internal_error"
            )
        return result, time.monotonic() - start

    def _cap_observation(self, text: str) -> str:
        ids = self.tokenizer.encode(text)
        if len(ids) <= self.max_observation_tokens:
            return text
        kept = self.tokenizer.decode(ids[: self.max_observation_tokens])
        cut = len(ids) - self.max_observation_tokens
        return f"{kept}\n... [output truncated: {cut} more tokens not shown]"

    def _budget_exhausted(self, episode: _Episode) -> str | None:
        if episode.turn >= self.max_turns:
            return "max_turns"
        if episode.tokens >= self.max_episode_tokens:
            return "max_episode_tokens"
        if (
            self.max_episode_seconds is not None
            and time.monotonic() - episode.started >= self.max_episode_seconds
        ):
            return "max_episode_seconds"
        return None

    async def _finish(
        self,
        parse: ParseResult,
        score: Score | None,
        *,
        truncated: bool,
        ended_with_eos: bool,
        reason: str | None = None,
        info_extra: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        episode = self._episode
        assert episode is not None
        episode.done = True
        await self._close_sessions()
        parts = self._reward_parts(episode, score)
        reward = float(sum(parts.values()))
        info = self._info(parse, **(info_extra or {}))
        info["reward_parts"] = parts
        if score is not None:
            info["verifier_parts"] = dict(score.parts)
        if truncated:
            info["truncation"] = reason
        ids = np.zeros(0, dtype=np.int64)
        return self._observation(ids, ""), reward, not truncated, truncated, info

    def _reward_parts(self, episode: _Episode, score: Score | None) -> dict[str, float]:
        cfg = self.rewards
        parts = {"outcome": float(score.value) if score is not None else 0.0}
        penalties = {
            "invalid_action": cfg.invalid_action_penalty * episode.invalid_actions,
            "tool_error": cfg.tool_error_penalty * episode.tool_errors,
            "missing_answer": cfg.missing_answer_penalty * (score is None),
        }
        total = sum(penalties.values())
        if cfg.max_penalty is not None and total > cfg.max_penalty:
            penalties = {k: v * cfg.max_penalty / total for k, v in penalties.items()}
        parts.update({k: -v for k, v in penalties.items() if v})
        return parts

    def _observation(self, ids: np.ndarray, text: str) -> dict[str, Any]:
        return {"tokens": np.asarray(ids, dtype=np.int64).copy(), "text": text}

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
        info.update(extra)
        return info


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InvalidConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
