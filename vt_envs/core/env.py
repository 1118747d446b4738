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
import contextlib
import logging
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from vt_envs.core.examples import WorkedExample, coerce_examples, render_examples
from vt_envs.core.image_tokens import ImageTokens, load_image_tokens, processor_spec
from vt_envs.core.loop import library_loop, on_library_loop, run_sync, submit
from vt_envs.core.parser import ActionParser, ParseResult, ToolCall
from vt_envs.core.prompt import ACTION_FORMATS, render_system_prompt
from vt_envs.core.spaces import ImageSequence, UnicodeText, token_sequence_space
from vt_envs.core.task import Task, TaskSource
from vt_envs.core.text import valid_utf8
from vt_envs.core.tokenizer import (
    IMAGE_MARK,
    IMAGE_TOKEN,
    ChatTokenizer,
    ObservationEncoder,
    load_tokenizer,
)
from vt_envs.core.tool import Tool, ToolResult, check_timeout
from vt_envs.core.verifier import Score, Verifier
from vt_envs.errors import EnvClosedError, InvalidConfigError, ResetNeededError

__all__ = ["OBSERVATION_FORMATS", "RewardConfig", "ToolEnv"]

#: What ``render()`` shows in ``rgb_array`` mode when the episode has no image (read-only).
BLANK_FRAME = np.full((64, 64, 3), 255, dtype=np.uint8)
BLANK_FRAME.flags.writeable = False

logger = logging.getLogger(__name__)

OBSERVATION_FORMATS = ("chat", "inline")
_MAX_TEXT_CHARS = 1 << 20
#: The longest image side the observation space admits.
MAX_IMAGE_SIDE = 8192


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
    started: float
    tokens: int
    messages: list[dict[str, Any]]
    # The episode's images in order (the task's, then each tool result's), by reference.
    images: list[np.ndarray] = field(default_factory=list)
    image_tokens: int = 0
    # One lock per tool whose session takes one call at a time.
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # Tools whose session could not be recovered after a cancelled call.
    broken: set[str] = field(default_factory=set)
    turn: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    invalid_actions: int = 0
    done: bool = False


class _OpenSessions:
    """The sessions of the running episode, held apart from the env so that a
    finalizer can close them when the env is dropped without ``close()``."""

    def __init__(self, tools: Mapping[str, Tool], verifier: Any = None):
        self.tools, self.verifier = tools, verifier
        self.sessions: dict[str, Any] = {}

    async def aclose(self) -> None:
        sessions, self.sessions = self.sessions, {}
        if not sessions:
            return
        if len(sessions) == 1:  # nothing to overlap: no task, no extra loop iteration
            ((name, session),) = sessions.items()
            try:
                await self.tools[name].close_session(session)
            except Exception as exc:
                logger.warning("closing the %s session failed: %r", name, exc)
            return
        results = await asyncio.gather(
            *(self.tools[n].close_session(s) for n, s in sessions.items()),
            return_exceptions=True,
        )
        for name, result in zip(sessions, results):
            if isinstance(result, BaseException):
                logger.warning("closing the %s session failed: %r", name, result)

    async def aclose_all(self) -> None:
        await self.aclose()
        closers = [tool.aclose() for tool in self.tools.values()]
        if hasattr(self.verifier, "aclose"):
            closers.append(self.verifier.aclose())
        await asyncio.gather(*closers)


# Tasks started by finalizers that ran on the loop thread (kept alive until done).
_FINALIZING: set[asyncio.Task] = set()


def _release_abandoned(live: _OpenSessions) -> None:
    """Finalizer of a ToolEnv dropped without ``close()``: close what it left open."""
    try:
        if on_library_loop():  # cannot block here: schedule it
            task = library_loop().create_task(live.aclose_all())
            _FINALIZING.add(task)
            task.add_done_callback(_FINALIZING.discard)
        else:
            submit(live.aclose_all()).result(timeout=30)
    except Exception as exc:  # interpreter shutdown; the sandboxes die with the process
        logger.debug("finalizing an abandoned env failed: %r", exc)


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
        elif max_image_tokens is not None:
            raise InvalidConfigError(
                "max_image_tokens= applies to envs with images; give task_images="
            )
        if max_image_tokens is not None and (
            isinstance(max_image_tokens, bool)
            or not isinstance(max_image_tokens, int)
            or max_image_tokens < 1
        ):
            raise InvalidConfigError(
                f"max_image_tokens must be an int >= 1 or None, got {max_image_tokens!r}"
            )
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

        self._episode: _Episode | None = None
        self._transcript: list[str] = []
        self._closed = False
        self._step_limit: int | None = None
        self._live = _OpenSessions(self.tools, verifier)
        # Dropped without close(): still release the sandboxes and connections.
        self._finalizer = weakref.finalize(self, _release_abandoned, self._live)

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
        images = self._images_of(task)
        messages = [
            {"role": "system", "content": self.system_prompt},
            *(dict(m) for m in self.example_messages),
            {"role": "user", "content": _place_images(task.prompt, len(images))},
        ]
        ids, text = self.encoder.encode_prompt(messages, images=images)
        image_tokens = self._count_image_tokens(images)
        if self.max_image_tokens is not None and sum(image_tokens) > self.max_image_tokens:
            raise InvalidConfigError(
                f"task {task.id!r} has images of {sum(image_tokens)} tokens, over "
                f"max_image_tokens={self.max_image_tokens}; raise the budget or lower the "
                "processor's max_pixels"
            )
        self._live.sessions = await self._open_sessions(task, session_seed)
        episode = _Episode(task, time.monotonic(), tokens=len(ids), messages=messages)
        episode.locks = {n: asyncio.Lock() for n, t in self.tools.items() if not t.concurrent_calls}
        episode.images, episode.image_tokens = list(images), sum(image_tokens)
        self._episode = episode
        self._transcript = [self._display(text)]
        public = [self._public_message(m, 0) for m in messages]
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
        text, ended_with_eos, n_action_tokens = self._decode_action(action, room)
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
        if parse.kind == "tool_call" and self._tool_budget_left(episode) > 0:
            feedback, results, images = await self._run_calls(episode, parse.calls)
            info_extra["tool"] = results[0]
            if len(results) > 1:
                info_extra["tools"] = results
            spent = next((r["ends_episode"] for r in results if "ends_episode" in r), None)
        else:
            episode.invalid_actions += 1
            feedback = self._invalid_feedback(episode, parse)
        if spent is not None:  # a tool's episode-wide limit (e.g. a disk quota) was passed
            return await self._finish(
                parse, None, truncated=True, reason=spent, info_extra=info_extra
            )
        image_tokens = self._count_image_tokens(images)
        if (
            self.max_image_tokens is not None
            and episode.image_tokens + sum(image_tokens) > self.max_image_tokens
        ):
            return await self._finish(
                parse, None, truncated=True, reason="max_image_tokens", info_extra=info_extra
            )

        truncation = self._budget_exhausted(episode)
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
        info_extra["message"] = self._public_message(message, len(episode.images))
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

    async def _open_sessions(self, task: Task, seed: int) -> dict[str, Any]:
        """Open every tool's session; on a failure or a cancellation, close the opened ones."""
        if len(self.tools) == 1:  # nothing to overlap: no task, no extra loop iteration
            ((name, tool),) = self.tools.items()
            return {name: await tool.open_session(task, seed=seed)}
        opening = {
            name: asyncio.ensure_future(tool.open_session(task, seed=seed))
            for name, tool in self.tools.items()
        }
        try:
            if opening:
                await asyncio.wait(opening.values())
        except BaseException:  # the reset was cancelled: no sandbox may outlive it
            for pending in opening.values():
                pending.cancel()
            await asyncio.wait(opening.values(), timeout=_OPEN_UNWIND_S)
            await self._close_opened(opening)
            raise
        failures = [t.exception() for t in opening.values() if t.exception() is not None]
        if failures:
            await self._close_opened(opening)
            raise failures[0]
        return {name: opened.result() for name, opened in opening.items()}

    async def _close_opened(self, opening: Mapping[str, asyncio.Future]) -> None:
        closing = _OpenSessions(self.tools)
        closing.sessions = {
            name: t.result()
            for name, t in opening.items()
            if t.done() and not t.cancelled() and t.exception() is None
        }
        await closing.aclose()

    def _decode_action(self, action: Any, room: int) -> tuple[str, bool, int]:
        """Return ``(text, ended_with_eos, token_count)`` of an action.

        Token ids are decoded (and counted as given). A text action is encoded
        only to count it against the token budget; training always uses the
        ids the policy generated, never these.

        ``room``: the tokens left in ``max_episode_tokens``. An action that
        does not fit is counted as ``room + 1`` tokens (text: without being
        encoded when it is provably too long, see
        :meth:`ChatTokenizer.count_up_to`) and only its first
        ``_MAX_TEXT_CHARS`` characters (ids: its first ``room + 1`` ids) are
        kept, for the transcript: it ends the episode unparsed.
        """
        eos = self.tokenizer.eos_token
        room = max(0, room)
        if isinstance(action, str):
            action = valid_utf8(action)  # (a lone surrogate would crash the tokenizer)
            count = self.tokenizer.count_up_to(action, room)
            ended = action.endswith(eos)
            if count > room:
                action = action[:_MAX_TEXT_CHARS]
            return action, ended, count
        ids = np.asarray(action)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(
                f"action must be a str or a 1-D sequence of token ids, got {type(action).__name__}"
                f" with shape {ids.shape} and dtype {ids.dtype}"
            )
        ended = bool(len(ids)) and int(ids[-1]) == self.tokenizer.eos_token_id
        count = min(len(ids), room + 1)  # (over the room: decoded no further than that)
        return self.tokenizer.decode(ids[:count].tolist()), ended, count

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
        # The parser's message may quote the action: an image mark in it is not an image.
        return (parse.message or "Invalid action.").replace(IMAGE_MARK, "")

    async def _run_calls(
        self, episode: _Episode, calls: Sequence[ToolCall]
    ) -> tuple[str, list[dict[str, Any]], list[np.ndarray]]:
        """Run an action's calls; return the observation text, the calls' infos and
        (image envs) the images the results added, marked in the text where they go."""
        calls = list(calls)[: self._tool_budget_left(episode)]
        # Calls to different sessions overlap; calls to one session queue on its
        # lock in the order written (asyncio.Lock is FIFO; gather starts them in order).
        results = await asyncio.gather(*(self._run_call(episode, call) for call in calls))
        texts, infos, images = [], [], []
        for call, (result, latency) in zip(calls, results):
            episode.tool_calls += 1
            episode.tool_errors += not result.ok
            text = self._cap_observation(result.text)
            if self.image_tokens is not None:
                text = text.replace(IMAGE_MARK, "")
                for image in result.images:
                    images.append(_frozen_image(image))
                    text += "\n" + IMAGE_MARK
            texts.append(text)
            infos.append(
                {
                    "name": call.name,
                    "ok": result.ok,
                    "error": result.error,
                    "latency_s": latency,
                    "metrics": dict(result.metrics),
                    **({"ends_episode": result.ends_episode} if result.ends_episode else {}),
                }
            )
        return "\n".join(texts), infos, images

    async def _run_call(self, episode: _Episode, call: ToolCall) -> tuple[ToolResult, float]:
        tool = self.tools[call.name]
        lock = episode.locks.get(call.name)
        async with lock if lock is not None else contextlib.nullcontext():
            if call.name in episode.broken:
                return _unavailable(call.name), 0.0
            timeout = tool.timeout_s
            if self.max_episode_seconds is not None:
                left = self.max_episode_seconds - (time.monotonic() - episode.started)
                if left <= 0:
                    return _out_of_time(call.name), 0.0
                timeout = min(timeout, left)
            start = time.monotonic()
            result = await self._call_with_backstop(episode, tool, call, timeout)
            return result, time.monotonic() - start

    async def _call_with_backstop(
        self, episode: _Episode, tool: Tool, call: ToolCall, timeout: float
    ) -> ToolResult:
        """Run one call under its deadline; the env's timer fires only at deadline + grace."""
        session = self._live.sessions.get(call.name)
        running = asyncio.ensure_future(tool.call(session, call.arguments, timeout_s=timeout))
        try:
            done, _ = await asyncio.wait({running}, timeout=timeout + tool.grace_s)
        except BaseException:  # this step itself was cancelled: close(), Ctrl-C, step_wait
            await _cancel_and_wait(running, tool.grace_s)
            raise
        if not done:
            logger.warning(
                "tool %s overran its %.3g s deadline by %.3g s; cancelling the call",
                call.name,
                timeout,
                tool.grace_s,
            )
            await _cancel_and_wait(running, tool.grace_s)
            if not (running.done() and await _recover(tool, session)):
                episode.broken.add(call.name)
                return _unavailable(call.name)
            return ToolResult.failure(
                f"Error: the {call.name} call did not finish within {timeout:.3g} s and was "
                "stopped; its session was reset.",
                "timeout",
            )
        try:
            return running.result()
        except (Exception, asyncio.CancelledError) as exc:  # a tool bug must not end the episode
            logger.error("tool %s raised %r", call.name, exc, exc_info=exc)
            return ToolResult.failure(
                f"Error: the {call.name} tool failed ({type(exc).__name__}).", "internal_error"
            )

    async def _verify(self, task: Task, answer: str) -> Score:
        """The verifier's score, under the verification deadline (overrun: 0)."""
        if getattr(self.verifier, "inline", False):  # cheap and pure: no thread, no deadline
            return self.verifier(task, answer)
        averify = getattr(self.verifier, "averify", None)
        # Off the event loop either way: a slow verifier (math-verify, SQL
        # execution) must not stall the other episodes sharing this loop.
        if averify is not None and getattr(self.verifier, "uses_tool_sessions", False):
            # It may grade inside the episode's own tool sessions (SQL: the worker
            # that already holds the episode's results), which are still open here.
            sessions = {n: (self.tools[n], s) for n, s in self._live.sessions.items()}
            running = asyncio.ensure_future(averify(task, answer, sessions=sessions))
        elif averify is not None:
            running = asyncio.ensure_future(averify(task, answer))
        else:
            running = asyncio.ensure_future(asyncio.to_thread(self.verifier, task, answer))
        try:
            done, _ = await asyncio.wait({running}, timeout=self.verify_timeout_s)
        except BaseException:
            running.cancel()
            raise
        if not done:
            running.cancel()  # (a thread cannot be stopped; its result is ignored)
            logger.warning("verification overran its %.3g s deadline", self.verify_timeout_s)
            return Score(0.0, {"timeout": 1.0}, "verification timed out")
        return running.result()

    def _cap_observation(self, text: str) -> str:
        ids = self.tokenizer.encode_text(text)
        if len(ids) <= self.max_observation_tokens:
            return text
        kept = self.tokenizer.decode(ids[: self.max_observation_tokens])
        cut = len(ids) - self.max_observation_tokens
        return f"{kept}\n... [output truncated: {cut} more tokens not shown]"

    def _turn_limit(self) -> int:
        if self._step_limit is None:
            return self.max_turns
        return min(self.max_turns, self._step_limit)

    def _budget_exhausted(self, episode: _Episode) -> str | None:
        if episode.turn >= self.max_turns:
            return "max_turns"
        if self._step_limit is not None and episode.turn >= self._step_limit:
            return "max_episode_steps"
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
        parts = self._reward_parts(episode, score)
        reward = float(sum(parts.values()))
        info = self._info(parse, **(info_extra or {}))
        info["reward_parts"] = parts
        if score is not None:
            info["verifier_parts"] = dict(score.parts)
        if truncated:
            info["truncation"] = reason
        return self.empty_observation(), reward, not truncated, truncated, info

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

    def _observation(
        self, ids: np.ndarray, text: str, images: Sequence[np.ndarray] = ()
    ) -> dict[str, Any]:
        observation = {"tokens": np.asarray(ids, dtype=np.int64).copy(), "text": text}
        if self.image_tokens is not None:
            observation["images"] = tuple(images)
        return observation

    def _images_of(self, task: Task) -> tuple[np.ndarray, ...]:
        if self.task_images is None:
            return ()
        return tuple(_frozen_image(image) for image in self.task_images(task))

    def _count_image_tokens(self, images: Sequence[np.ndarray]) -> list[int]:
        if self.image_tokens is None:
            return []
        return [self.image_tokens.count(image) for image in images]

    def _display(self, text: str) -> str:
        """``text`` for the ansi transcript: each expanded image back to its placeholder."""
        return text if self.image_tokens is None else self.image_tokens.collapse(text)

    def _public_message(self, message: Mapping[str, Any], first_image: int) -> dict[str, Any]:
        """A message as ``info`` shows it: images as parts that index the episode's images."""
        content = str(message["content"])
        if IMAGE_MARK not in content:
            return dict(message)
        parts: list[dict[str, Any]] = []
        for k, piece in enumerate(content.split(IMAGE_MARK)):
            if k:
                parts.append({"type": "image", "index": first_image + k - 1})
            if piece:
                parts.append({"type": "text", "text": piece})
        return {**message, "content": parts}

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


# How long a cancelled reset waits for half-opened sessions before closing them.
_OPEN_UNWIND_S = 15.0


async def _cancel_and_wait(task: asyncio.Future, timeout: float) -> None:
    """Cancel ``task`` and give it ``timeout`` seconds to unwind (kill, interrupt, reap)."""
    task.cancel()
    await asyncio.wait({task}, timeout=timeout)


async def _recover(tool: Tool, session: Any) -> bool:
    """Run the tool's recovery hook for ``session``, bounded by its grace; ``True`` on success."""
    try:
        await asyncio.wait_for(tool.recover_session(session), tool.grace_s)
        return True
    except (Exception, asyncio.TimeoutError) as exc:
        logger.warning("recovering the %s session failed: %r", tool.name, exc)
        return False


def _unavailable(name: str) -> ToolResult:
    return ToolResult.failure(
        f"Error: the {name} tool is unavailable for the rest of this episode (an earlier "
        "call could not be stopped).",
        "unavailable",
    )


def _out_of_time(name: str) -> ToolResult:
    return ToolResult.failure(
        f"Error: the {name} call was not run: the episode's time budget is spent.", "timeout"
    )


def _place_images(prompt: str, count: int) -> str:
    """The prompt with its first ``count`` ``<image>`` markers as image marks (and marks
    for images beyond the markers, first); further markers stay text."""
    prompt = prompt.replace(IMAGE_MARK, "")
    pieces = prompt.split(IMAGE_TOKEN, count)
    missing = count - (len(pieces) - 1)
    head = (IMAGE_MARK + "\n") * missing
    return head + IMAGE_MARK.join(pieces)


def _frozen_image(image: Any) -> np.ndarray:
    """``image`` as a read-only ``HxWx3 uint8`` array: itself if it already is one, else a
    read-only view (no copy) or, for other dtypes and layouts, a converted copy."""
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        raise InvalidConfigError(
            f"an image must be an HxWx3 uint8 array, got shape {array.shape} ({array.dtype})"
        )
    if array.dtype != np.uint8:
        array = array.astype(np.uint8)
    if array.flags.writeable:
        array = array.view()
        array.setflags(write=False)
    return array


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InvalidConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
