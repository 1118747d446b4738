"""ToolEnv: the generic episode of an LLM agent that uses tools.

A domain env (SQL, math, ...) is a *configuration* of :class:`ToolEnv` —
tools + task source + verifier + instructions + budgets — registered under an
id; a benchmark author writes no env class.

The core is async (:meth:`ToolEnv.areset`, :meth:`ToolEnv.astep`,
:meth:`ToolEnv.aclose`); the Gymnasium methods ``reset``/``step``/``close``
run those coroutines on the library's long-lived event loop
(:mod:`vt_envs.core.loop`).

Those coroutines are :class:`~vt_envs.core.env_core.ToolEnvCore`'s, which lists the
modules that hold the episode's pieces.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from vt_envs.core.actions import MAX_TEXT_CHARS
from vt_envs.core.env_core import ToolEnvCore
from vt_envs.core.episode import Episode, OpenSessions, check_budgets, release_abandoned
from vt_envs.core.examples import WorkedExample, coerce_examples, render_examples
from vt_envs.core.image_tokens import ImageTokens, load_image_tokens, processor_spec
from vt_envs.core.images import BLANK_FRAME, MAX_IMAGE_SIDE, check_image_budget
from vt_envs.core.loop import run_sync
from vt_envs.core.observation_encoder import ObservationEncoder
from vt_envs.core.parser import ActionParser
from vt_envs.core.prompt import ACTION_FORMATS, render_system_prompt
from vt_envs.core.reward import RewardConfig
from vt_envs.core.spaces import ImageSequence, UnicodeText, token_sequence_space
from vt_envs.core.task import Task, TaskSource
from vt_envs.core.tokenizer import ChatTokenizer, load_tokenizer
from vt_envs.core.tool import Tool, check_timeout, compose_tools
from vt_envs.core.verifier import Verifier, as_verifier
from vt_envs.errors import InvalidConfigError

__all__ = ["OBSERVATION_FORMATS", "RewardConfig", "ToolEnv"]

# The names these pieces had when they lived here, for code that imported them.
_Episode, _OpenSessions, _release_abandoned = Episode, OpenSessions, release_abandoned

OBSERVATION_FORMATS = ("chat", "inline")


class ToolEnv(ToolEnvCore):
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
        verifier: a :class:`~vt_envs.core.verifier.Verifier`, or a function
            ``(task, answer_text) -> Score`` (scored in a thread).
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
        extra_tools: tools added to the env's own, composed when the env is built:
            a registered tool's name (``"python"``, ``"bash"``, or a plugin's;
            built with its defaults), a mapping ``{"name": "python", "timeout_s":
            5.0}`` (built with those keywords) or a :class:`Tool`. The system prompt
            describes them with the others; names must not clash with the env's
            tools. Not with ``tool_server=`` (the server serves the env's own tools).
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
        extra_tools: Sequence[Tool | str | Mapping[str, Any]] = (),
        name: str = "ToolEnv",
    ):
        if task_images is not None:  # image envs can also render their latest image
            self.metadata = {**self.metadata, "render_modes": ["ansi", "rgb_array"]}
        check_image_budget(max_image_tokens, image_env=task_images is not None)
        _check_choice("observation_format", observation_format, OBSERVATION_FORMATS)
        _check_choice("action_format", action_format, ACTION_FORMATS)
        _check_choice("render_mode", render_mode, (None, *self.metadata["render_modes"]))
        check_budgets(
            max_turns=max_turns,
            max_calls_per_turn=max_calls_per_turn,
            max_episode_tokens=max_episode_tokens,
            max_observation_tokens=max_observation_tokens,
            max_tool_calls=max_tool_calls,
        )
        # (asyncio alone waits on these, and a domain may derive them: no upper limit)
        verify_timeout_s = check_timeout(
            "verify_timeout_s", verify_timeout_s, optional=True, limit=math.inf
        )
        max_episode_seconds = check_timeout(
            "max_episode_seconds", max_episode_seconds, optional=True, limit=math.inf
        )
        tools, self.extra_tool_names = compose_tools(tools, extra_tools, owner=name)
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
            "text": UnicodeText(MAX_TEXT_CHARS),
        }
        if task_images is not None:
            spaces["images"] = ImageSequence(MAX_IMAGE_SIDE)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = UnicodeText(MAX_TEXT_CHARS)

        self._episode: Episode | None = None
        self._transcript: list[str] = []
        self._closed = False
        self._step_limit: int | None = None
        self._live = OpenSessions(self.tools, self.verifier)
        # Dropped without close(): still release the sandboxes and connections.
        self._finalizer = weakref.finalize(self, release_abandoned, self._live)

    @property
    def verifier(self) -> Verifier:
        """The env's :class:`~vt_envs.core.verifier.Verifier` (a function assigned
        here is wrapped by :func:`~vt_envs.core.verifier.as_verifier`)."""
        return self._verifier

    @verifier.setter
    def verifier(self, verifier: Any) -> None:
        self._verifier = as_verifier(verifier)
        live = getattr(self, "_live", None)
        if live is not None:  # the one the env closes
            live.verifier = self._verifier

    # ------------------------------------------------------------------ API

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

    def truncate(self, reason: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Sync twin of :meth:`atruncate`."""
        return run_sync(self.atruncate(reason), method="truncate", async_method="atruncate")

    # ---------------------------------------------------- Gymnasium wrappers

    def bind_step_limit(self, max_episode_steps: int | None) -> None:
        """Adopt Gymnasium's ``max_episode_steps`` as a turn budget (called by ``TimeLimit``).

        ``gym.make(id, max_episode_steps=N)`` wraps the env in ``TimeLimit``;
        :mod:`vt_envs.core.wrappers` makes that wrapper report ``N`` here, so
        the env truncates on the same step, closing its sessions and filling
        ``reward_parts`` as for its own budgets.
        """
        self._step_limit = max_episode_steps


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InvalidConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
