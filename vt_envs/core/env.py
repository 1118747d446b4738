"""ToolEnv: the generic episode of an LLM agent that uses tools.

A domain env (SQL, math, ...) is a *configuration* of :class:`ToolEnv` —
tools + task source + verifier + instructions + budgets — registered under an
id; a benchmark author writes no env class.

The core is async (:meth:`ToolEnv.areset`, :meth:`ToolEnv.astep`,
:meth:`ToolEnv.aclose`); the Gymnasium methods ``reset``/``step``/``close``
run those coroutines on the library's long-lived event loop
(:mod:`vt_envs.core.loop`).

The episode's pieces live beside it: its state, sessions and budgets in
:mod:`vt_envs.core.episode`, running tool calls in :mod:`vt_envs.core.tool_calls`,
grading and shaping in :mod:`vt_envs.core.reward`, images in
:mod:`vt_envs.core.images`, reading an action in :mod:`vt_envs.core.actions`.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from vt_envs.core.actions import decode_action
from vt_envs.core.episode import (
    Episode,
    OpenSessions,
    budget_exhausted,
    release_abandoned,
    tool_calls_left,
    turn_limit,
)
from vt_envs.core.examples import WorkedExample, coerce_examples, render_examples
from vt_envs.core.image_tokens import ImageTokens, load_image_tokens, processor_spec
from vt_envs.core.images import (
    BLANK_FRAME,
    MAX_IMAGE_SIDE,
    check_image_budget,
    collapse_images,
    count_image_tokens,
    place_images,
    public_message,
    task_images_of,
)
from vt_envs.core.loop import run_sync
from vt_envs.core.parser import ActionParser, ParseResult
from vt_envs.core.prompt import ACTION_FORMATS, render_system_prompt
from vt_envs.core.reward import RewardConfig, reward_parts, verify
from vt_envs.core.spaces import ImageSequence, UnicodeText, token_sequence_space
from vt_envs.core.task import Task, TaskSource
from vt_envs.core.tokenizer import ChatTokenizer, ObservationEncoder, load_tokenizer
from vt_envs.core.tool import Tool, check_timeout
from vt_envs.core.tool_calls import cap_observation, invalid_feedback, run_calls
from vt_envs.core.verifier import Score, Verifier
from vt_envs.errors import EnvClosedError, InvalidConfigError, ResetNeededError

__all__ = ["OBSERVATION_FORMATS", "RewardConfig", "ToolEnv"]

# The names these pieces had when they lived here, for code that imported them.
_Episode, _OpenSessions, _release_abandoned = Episode, OpenSessions, release_abandoned

OBSERVATION_FORMATS = ("chat", "inline")
_MAX_TEXT_CHARS = 1 << 20


class ToolEnv(gym.Env[dict, str]):
    """An episode in which an LLM agent calls tools and gives a final answer.

    Observation (a dict):
        ``tokens`` — ``np.ndarray[int64]``: the exact ids to append to the
        policy's context. On reset: the whole prompt, ending with the
        assistant header. On a step: the ids between this action and the next
        one (the turn boundary, the tool message, the next assistant header in
        the ``chat`` format; the wrapped tool output in ``inline``). On the
        final step: empty — the env emits no turn close after the last
        action, so a trajectory ends with the policy's own last id.
        ``text`` — the same observation as text (``tokenizer.decode(tokens)``).
        ``images`` (envs made with ``task_images``) — a tuple of ``HxWx3 uint8``
        read-only arrays: on reset the task's images, on a step only the
        images that step's tool results added, in order; each image's ids
        (one ``<image>``, or a processor's expansion) sit in ``tokens`` where
        the image goes. An image is held by reference, never copied.

    Action: the text the policy generated this turn (``str``), or its token ids
    (a 1-D integer array or list), which the env decodes. The env never
    re-tokenizes an action: the trainer keeps the ids it generated.

    Reward: 0 on every step but the last; on the last, the verifier's score of
    the model's own answer plus any shaping from :class:`RewardConfig`,
    broken down in ``info["reward_parts"]``.

    ``terminated``: the agent answered. ``truncated``: ``max_turns``,
    ``max_episode_tokens``, ``max_episode_seconds`` or Gymnasium's
    ``max_episode_steps`` (``gym.make(id, max_episode_steps=N)``) ran out
    first, or a tool's episode-wide limit was passed (``ToolResult.ends_episode``,
    e.g. ``"disk_quota"``); ``info["truncation"]`` names which, and the sessions are closed and
    ``reward_parts`` filled the same way for each. An action that alone does not
    fit what is left of ``max_episode_tokens`` ends the episode so (truncated)
    before it is parsed: its calls do not run and an answer in it is not graded,
    like a generation cut at a length limit; it is counted as one token past the
    budget, and a text action provably that long is never tokenized (see
    :meth:`ChatTokenizer.count_up_to`).

    ``info`` always has ``task_id``, ``turn``, ``parse`` (``None`` on reset and
    for an action over the token budget),
    ``tool_calls``, ``tool_errors``, ``invalid_actions``, ``episode_tokens``;
    ``tool`` (name, ok, error, latency_s) when a tool ran; ``reward_parts`` on
    the final step. For policies that work with chat messages rather than
    token ids (an OpenAI-compatible endpoint), ``info["messages"]`` on reset
    holds the prompt messages and ``info["message"]`` on each non-final step
    the env's new message (role and content, before templating; a content
    that holds images is a list of parts, ``{"type": "text", "text": ...}``
    and ``{"type": "image", "index": k}`` with ``k`` the image's index in the
    episode). Image envs add ``image_tokens`` (the token count of each image
    in this observation) and ``episode_image_tokens`` (the running total).

    Policy mistakes (malformed calls, unknown tools, tool errors, timeouts)
    are observations the agent reads, never exceptions.

    Tool calls: each call gets a deadline, the tool's ``timeout_s`` cut to
    what is left of ``max_episode_seconds``; the tool enforces it itself and
    the env's timer is a backstop at the deadline plus the tool's
    ``grace_s`` (see :mod:`vt_envs.core.tool`). Calls on one session run one
    at a time, in the order the action wrote them.

    Text the policy did not write (tool output, the task prompt, the system
    prompt) is encoded with special tokens split, so it cannot forge a turn.

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
        chat_template_kwargs: extra variables for the chat template
            (``{"enable_thinking": False}`` for Qwen3).
        template_tools: pass the tools' function specs to the chat template
            as ``tools=`` (Qwen and Hermes templates list them in the system
            prompt themselves); the env's system prompt then does not list them.
        max_turns: actions per episode before truncation.
        max_tool_calls: tool calls per episode; after that the env says so and
            only an answer is accepted. ``None``: no cap beyond ``max_turns``.
        max_calls_per_turn: tool calls run from one action (calls to one
            stateful session run in order; the prompt says how many are allowed).
        max_episode_tokens: context budget (prompt + actions + observations).
        max_episode_seconds: wall-clock budget from reset; it also caps the
            time a tool call may take. ``None``: no wall-clock budget.
        max_observation_tokens: tool output longer than this is cut, with a
            note saying how much.
        verify_timeout_s: deadline of the verifier on the final answer; past
            it the answer scores 0 (``verifier_parts["timeout"] = 1``).
            ``None``: no deadline.
        answer_tags: tags that hold the final answer.
        boxed_answers: also accept the last ``\\boxed{...}`` as the answer.
        remind_turns_left: append "(N turns left)" to each observation.
        rewards: optional shaping (see :class:`RewardConfig`).
        render_mode: ``None``, ``"ansi"`` (the transcript as text) or, for image
            envs, ``"rgb_array"`` (the latest image).
        task_images: ``task -> images`` (``HxWx3 uint8`` arrays) makes an image
            env: the task prompt's ``<image>`` markers say where each image
            goes (images without a marker go first), tool results may add
            images (``ToolResult.images``), and ``obs["images"]`` carries them.
        processor: the path of a local Qwen2-VL / Qwen2.5-VL-style processor
            directory (or a processor object): its tokenizer is the default
            ``tokenizer``, and in an env with images each image expands to
            the processor's exact token sequence. ``None``: one ``<image>``
            id per image. A vision-language policy passes it to every env,
            text-only ones included.
        max_image_tokens: budget of image tokens per episode; a step whose
            images would pass it ends the episode, truncated with
            ``"max_image_tokens"``. ``None``: no budget beyond the tokens'.
        examples: worked examples (:class:`~vt_envs.core.examples.WorkedExample`,
            or their mappings) shown as chat turns between the system prompt
            and the task, rendered in this env's formats and parsed back when
            the env is built (see :mod:`vt_envs.core.examples`). ``None`` or
            ``()``: none. Domains pass their own by default.
        grade_truncated: when a budget ends the episode before an answer, run the
            verifier anyway (on the answer ``""``) instead of scoring 0: the
            reward of an SWE agent that fixed the bug but did not submit.
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
        chat_template_kwargs: Mapping[str, Any] | None = None,
        template_tools: bool = False,
        max_turns: int = 8,
        max_tool_calls: int | None = None,
        max_calls_per_turn: int = 1,
        max_episode_tokens: int = 8192,
        max_episode_seconds: float | None = None,
        max_observation_tokens: int = 512,
        verify_timeout_s: float | None = 60.0,
        answer_tags: Sequence[str] = ("answer",),
        boxed_answers: bool = False,
        remind_turns_left: bool = False,
        rewards: RewardConfig | Mapping[str, float] | None = None,
        render_mode: str | None = None,
        task_images: Callable[[Task], Sequence[np.ndarray]] | None = None,
        processor: Any = None,
        max_image_tokens: int | None = None,
        grade_truncated: bool = False,
        examples: Sequence[WorkedExample | Mapping[str, Any]] | None = None,
        name: str = "ToolEnv",
    ):
        if task_images is not None:  # image envs can also render their latest image
            self.metadata = {**self.metadata, "render_modes": ["ansi", "rgb_array"]}
        check_image_budget(max_image_tokens, image_env=task_images is not None)
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
        # (asyncio alone waits on these, and a domain may derive them: no upper limit)
        verify_timeout_s = check_timeout(
            "verify_timeout_s", verify_timeout_s, optional=True, limit=math.inf
        )
        max_episode_seconds = check_timeout(
            "max_episode_seconds", max_episode_seconds, optional=True, limit=math.inf
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
        self.verify_timeout_s = verify_timeout_s
        self.remind_turns_left = remind_turns_left
        self.rewards = rewards
        self.render_mode = render_mode
        self.observation_format = observation_format

        spec = processor_spec(processor) if processor is not None else None
        if tokenizer is None and processor is not None:  # the processor's own tokenizer
            tokenizer = getattr(processor, "tokenizer", processor)
        self.tokenizer: ChatTokenizer = load_tokenizer(tokenizer)
        self.task_images = task_images
        self.max_image_tokens = max_image_tokens
        self.grade_truncated = grade_truncated
        self.image_tokens: ImageTokens | None = (
            load_image_tokens(self.tokenizer, spec) if task_images is not None else None
        )
        self.encoder = ObservationEncoder(
            self.tokenizer,
            observation_format,
            inline_template=inline_template,
            tools=[tool.spec() for tool in tools] if template_tools else None,
            chat_template_kwargs=chat_template_kwargs,
            image_tokens=self.image_tokens,
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
            calls_per_turn=max_calls_per_turn,
            list_tools=not template_tools,
        )
        self._answer_tag = answer_tags[0]
        self.examples = coerce_examples(examples)
        self.example_messages: list[dict[str, str]] = render_examples(
            self.examples,
            tools=self.tools,
            parser=self.parser,
            action_format=action_format,
            observation_format=observation_format,
            inline_template=inline_template,
            answer_tag=self._answer_tag,
            observation_role=self.encoder.observation_role,
        )
        """The worked examples as chat messages, between the system prompt and the task."""
        self.stop_strings: tuple[str, ...] = self.parser.stop_strings
        """Strings at which a policy should stop generating so the env can act."""

        spaces: dict[str, gym.Space] = {
            "tokens": token_sequence_space(self.tokenizer.vocab_size),
            "text": UnicodeText(_MAX_TEXT_CHARS),
        }
        if task_images is not None:
            spaces["images"] = ImageSequence(MAX_IMAGE_SIDE)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = UnicodeText(_MAX_TEXT_CHARS)

        self._episode: Episode | None = None
        self._transcript: list[str] = []
        self._closed = False
        self._step_limit: int | None = None
        self._live = OpenSessions(self.tools, verifier)
        # Dropped without close(): still release the sandboxes and connections.
        self._finalizer = weakref.finalize(self, release_abandoned, self._live)

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
        room = self.max_episode_tokens - episode.tokens
        text, ended_with_eos, n_action_tokens = decode_action(
            action, self.tokenizer, room, _MAX_TEXT_CHARS
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

    def step(
        self, action: str | Sequence[int] | np.ndarray
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply one action; return ``(observation, reward, terminated, truncated, info)``.

        The action is parsed: an answer ends the episode (scored by the
        verifier); a tool call runs the tool (under its deadline) and its
        output becomes the observation; anything else becomes an observation
        explaining the expected format.
        """
        return run_sync(self.astep(action), method="step", async_method="astep")

    def render(self) -> str | np.ndarray | None:
        """With ``render_mode="ansi"``: the transcript so far (prompt, actions,
        observations; each image as its unexpanded placeholder). With
        ``"rgb_array"`` (image envs): the episode's latest image, or a blank
        frame (:data:`BLANK_FRAME`) while there is none (before the first
        reset, or on a task without images in an env where some have them)."""
        if self.render_mode == "ansi":
            return "".join(self._transcript)
        if self.render_mode == "rgb_array":
            if self._episode is not None and self._episode.images:
                return self._episode.images[-1]
            return BLANK_FRAME
        return None

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

    async def atruncate(
        self, reason: str
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """End the running episode now, truncated for ``reason`` (a budget the
        caller keeps, such as a trainer's context limit).

        Returns the final step's ``(observation, reward, terminated, truncated,
        info)``, exactly as when one of the env's own budgets runs out: the
        sessions are closed, shaping (``missing_answer_penalty``...) applies,
        and ``info`` has ``reward_parts`` and ``truncation == reason``.
        """
        self._ensure_running()
        return await self._finish(None, None, truncated=True, reason=reason)

    def truncate(self, reason: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Sync twin of :meth:`atruncate`."""
        return run_sync(self.atruncate(reason), method="truncate", async_method="atruncate")

    async def _abandon_episode(self) -> None:
        """End the running episode without a result, closing its sessions (a vector
        env does this to a sub-env whose step raised)."""
        if self._episode is not None:
            self._episode.done = True
        await self._live.aclose()

    @property
    def answer_tag(self) -> str:
        """The tag the agent's final answer goes in (``answer``; ``submit`` on VT-SWE-v0)."""
        return self._answer_tag

    # ---------------------------------------------------- Gymnasium wrappers

    def bind_step_limit(self, max_episode_steps: int | None) -> None:
        """Adopt Gymnasium's ``max_episode_steps`` as a turn budget (called by ``TimeLimit``).

        ``gym.make(id, max_episode_steps=N)`` wraps the env in ``TimeLimit``;
        :mod:`vt_envs.core.wrappers` makes that wrapper report ``N`` here, so
        the env truncates on the same step, closing its sessions and filling
        ``reward_parts`` as for its own budgets.
        """
        self._step_limit = max_episode_steps

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
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
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


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InvalidConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
