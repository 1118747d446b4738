"""Prompts and observations as token ids: :class:`ObservationEncoder`.

The encoder produces the ids of the prompt and of each observation, so that
``prompt + action_1 + obs_1 + action_2 + ...`` decodes to the transcript the
chat template renders for that conversation; the policy's generated ids are
never re-tokenized. It serves any :class:`~vt_envs.core.tokenizer.ChatTokenizer`
(what :func:`~vt_envs.core.tokenizer.load_tokenizer` accepts). Also importable
from :mod:`vt_envs.core.tokenizer`.
"""

from __future__ import annotations

import itertools
import string
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vt_envs.core.tokenizer import IMAGE_MARK, OBSERVATION_FORMATS, Messages, load_tokenizer
from vt_envs.errors import InvalidConfigError, TemplateError, did_you_mean

__all__ = ["PROMPT_CACHE_SIZE", "PROMPT_CACHE_TOKENS", "ObservationEncoder"]


# Stand-ins rendered in place of the last action and of the new observation, to
# find where they sit in a render. Plain words: templates render them verbatim.
_ACTION_MARK = "VTactionMark7c1e"
_OBSERVATION_MARK = "VTobservationMark5e2b"
# The probe conversation checked at construction, so that a template or a
# tokenizer the encoder cannot serve fails there, not in the middle of an episode.
_PROBE_SYSTEM = "You are a helpful assistant."
_PROBE_USER = "Hi."


#: Prompts an :class:`ObservationEncoder` keeps encoded, at most...
PROMPT_CACHE_SIZE = 4096
#: ... and their ids, at most (about 12 bytes a token with its text: ~6 MB). Bounded
#: by tokens, not only by count, so that short prompts (VT-Lookup-v0's 500 test tasks
#: at ~200 tokens) are all kept while long ones (2,700 tokens) still are ~190.
PROMPT_CACHE_TOKENS = 1 << 19


def _messages_key(messages: Messages) -> tuple | None:
    """A key for ``messages`` whose keys and values are all strings, else ``None``
    (``1``, ``1.0`` and ``True`` are equal keys but render differently). Items in
    their order: a message written in another order is only kept apart."""
    key = tuple([tuple(m.items()) for m in messages])
    for items in key:
        for name, value in items:
            if type(name) is not str or type(value) is not str:
                return None
    return key


def _array(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64).reshape(-1)


@dataclass(frozen=True)
class _Boundary:
    """What the template renders around an assistant turn (found once per encoder)."""

    close_text: str  # closes an assistant turn: ``<|im_end|>\n`` in ChatML
    close_ids: tuple[int, ...]
    after_eos_ids: tuple[int, ...]  # the part of close_ids after the eos token: ``\n``
    header_ids: tuple[int, ...]  # opens an assistant turn: ``<|im_start|>assistant\n``


class ObservationEncoder:
    """Encodes prompts and observations token-in / token-out.

    Args:
        tokenizer: anything :func:`~vt_envs.core.tokenizer.load_tokenizer` accepts.
        format: ``"chat"`` (the observation is a new ``observation_role``
            message, rendered by the chat template) or ``"inline"`` (ToRL
            style: ``inline_template.format(text=text)`` inside the assistant
            turn, with no turn boundary).
        observation_role: the role of observation messages in ``chat``.
        inline_template: must contain the single field ``{text}``; literal
            braces are doubled, as in ``str.format``.
        tools: function specs passed to the chat template as ``tools=``
            (templates such as Qwen's render them into the system prompt).
        chat_template_kwargs: extra template variables (``enable_thinking``).
        image_tokens: how an image becomes ids (an
            :class:`~vt_envs.core.image_tokens.ImageTokens`); needed only to
            encode contents that hold :data:`~vt_envs.core.tokenizer.IMAGE_MARK`.

    Images: wherever a message's content (or an observation's text) holds
    :data:`~vt_envs.core.tokenizer.IMAGE_MARK`, the next of the ``images`` given is spliced in as
    ``image_tokens.ids(image)``; the text around it is encoded on its own, as a
    tokenizer does around a special token.

    Every method returns ``(ids, text)`` with ``ids`` an ``int64`` array and
    ``text == tokenizer.decode(ids)``. Message contents are encoded with
    :meth:`~vt_envs.core.tokenizer.ChatTokenizer.encode_text` (special tokens split) wherever they
    contain a special-token string, so only the template's markup yields
    control ids. Raises :class:`TemplateError` at construction if the
    template or tokenizer cannot be served (the template does not render
    assistant content verbatim, rewrites the prompt when a message is added,
    or closes turns with text that merges into the next tokens).
    """

    def __init__(
        self,
        tokenizer: Any = None,
        format: str = "chat",
        *,
        observation_role: str = "tool",
        inline_template: str = "\n<output>\n{text}\n</output>\n",
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        image_tokens: Any = None,
    ):
        if format not in OBSERVATION_FORMATS:
            raise InvalidConfigError(
                f"observation format must be one of {OBSERVATION_FORMATS}, got {format!r}."
                f"{did_you_mean(str(format), OBSERVATION_FORMATS)}"
            )
        _check_inline_template(inline_template)
        self.tokenizer = load_tokenizer(tokenizer)
        self.format = format
        self.observation_role = observation_role
        self.inline_template = inline_template
        self.tools = [dict(t) for t in tools] if tools else None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.image_tokens = image_tokens
        self._prompts: OrderedDict[tuple, tuple[np.ndarray, str]] = OrderedDict()
        self._prompt_tokens = 0  # the ids kept in _prompts
        probe = self._probe_prompt()
        self._boundary = self._find_boundary(probe)
        # Fail now, not mid-episode: one observation that holds every special token.
        forged = "".join(self.tokenizer.special_tokens) or "probe"
        history = [*probe, {"role": "assistant", "content": "ok"}]
        ids, text = self.encode_observation(forged, history=history, action_ended_with_eos=False)
        if self.tokenizer.decode(ids) != text:
            raise TemplateError(
                f"tokenizer {self.tokenizer.name!r} does not encode text pieces losslessly "
                "(does it add a prefix space to every encode call?); token-in/token-out "
                "needs a byte-level tokenizer"
            )

    def render(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        """The chat template's text for ``messages`` (with this encoder's tools and kwargs)."""
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=self.tools,
            **self.chat_template_kwargs,
        )

    def encode_prompt(
        self, messages: Messages, *, images: Sequence[np.ndarray] = ()
    ) -> tuple[np.ndarray, str]:
        """The whole prompt, rendered with the generation prompt (it ends with
        the assistant header, ready to generate); ``images`` fill the
        contents' image marks in order.

        Prompts without images are kept (the latest, by their messages, up to
        :data:`PROMPT_CACHE_SIZE` prompts and :data:`PROMPT_CACHE_TOKENS` ids): a
        task reset again, as in a GRPO group, is not rendered or tokenized again.
        The ids returned are a copy.
        """
        key = None if images else _messages_key(messages)
        if key is not None:
            kept = self._prompts.get(key)
            if kept is not None:
                self._prompts.move_to_end(key)
                return kept[0].copy(), kept[1]
        ids, text = self._encode_prompt(messages, images)
        if key is not None and len(ids) <= PROMPT_CACHE_TOKENS:
            self._prompts[key] = (ids.copy(), text)
            self._prompt_tokens += len(ids)
            while (
                len(self._prompts) > PROMPT_CACHE_SIZE or self._prompt_tokens > PROMPT_CACHE_TOKENS
            ):
                self._prompt_tokens -= len(self._prompts.popitem(last=False)[1][0])
        return ids, text

    def _encode_prompt(
        self, messages: Messages, images: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, str]:
        text = self.render(messages, add_generation_prompt=True)
        marks = sum(str(m.get("content", "")).count(IMAGE_MARK) for m in messages)
        queue = self._image_queue(images, marks)
        if not any(self.tokenizer.contains_special(str(m.get("content", ""))) for m in messages):
            if not marks:
                ids, decoded = self.tokenizer.encode_with_text(text)
                return _array(ids), decoded
            return self._pair(self._encode_around_images(text, self.tokenizer.encode, queue))
        return self._pair(self._encode_with_plain_contents(messages, text, queue))

    def encode_observation(
        self,
        text: str,
        *,
        history: Messages | None = None,
        action_ended_with_eos: bool,
        images: Sequence[np.ndarray] = (),
    ) -> tuple[np.ndarray, str]:
        """The ids to append after an action's generated ids.

        ``history``: the episode's messages so far, ending with the assistant
        message that holds the action (needed by ``chat``; ignored by
        ``inline``). ``images`` fill the image marks of ``text`` in order.

        ``chat``: the tokens that close the assistant turn (all of them, or
        only those after the eos token if the action already ended with it),
        then the observation message, then the next assistant header — the
        part of the template's render of ``history + [observation]`` after
        the action. Earlier turns may render differently once a message is
        added (Qwen3 drops empty ``<think></think>`` blocks of earlier turns);
        that is allowed, since the ids already given stay what the policy saw.
        The prompt part of the render must not change, and the last action
        must be rendered verbatim, else :class:`TemplateError`.

        ``inline``: ``inline_template.format(text=text)``, encoded as plain
        text. If the action ended with eos (the turn is closed), the rest of
        the turn close and a new assistant header come first, so the output
        is never left outside a turn.
        """
        b = self._boundary
        queue = self._image_queue(images, text.count(IMAGE_MARK))
        if self.format == "inline":
            body = self._encode_around_images(
                self.inline_template.format(text=text), self.tokenizer.encode_text, queue
            )
            if action_ended_with_eos:
                return self._pair([*b.after_eos_ids, *b.header_ids, *body])
            return self._pair(body)
        if not history or history[-1].get("role") != "assistant":
            raise InvalidConfigError(
                "encode_observation(format='chat') needs history=the conversation so far, "
                "ending with the assistant message that holds the action"
            )
        close = b.after_eos_ids if action_ended_with_eos else b.close_ids
        before, after = self._observation_markup(history)
        if not self.tokenizer.contains_special(text):
            # One encode of the whole tail, as the template's own tokenization would give.
            tail_text = b.close_text + before + text + after
            ids = self._encode_around_images(tail_text, self.tokenizer.encode, queue)
            if ids[: len(b.close_ids)] != list(b.close_ids):
                raise TemplateError(
                    f"the chat template of {self.tokenizer.name!r} closes assistant turns with "
                    "text whose tokens merge with the next message's"
                )
            return self._pair([*close, *ids[len(b.close_ids) :]])
        middle = self._encode_around_images(text, self.tokenizer.encode_text, queue)
        tail = self.tokenizer.encode(b.close_text + before)[len(b.close_ids) :]
        return self._pair([*close, *tail, *middle, *self.tokenizer.encode(after)])

    # -- internals ---------------------------------------------------------

    def _pair(self, ids: Sequence[int]) -> tuple[np.ndarray, str]:
        return _array(ids), self.tokenizer.decode(list(ids))

    def _image_queue(self, images: Sequence[np.ndarray], marks: int) -> Iterator[np.ndarray]:
        if len(images) != marks:
            raise InvalidConfigError(
                f"the text to encode holds {marks} image mark(s) but {len(images)} image(s) "
                "were given; give one image per IMAGE_MARK"
            )
        if marks and self.image_tokens is None:
            raise InvalidConfigError(
                "the text to encode holds images but the encoder has no image_tokens; "
                "construct ObservationEncoder(..., image_tokens=load_image_tokens(tokenizer))"
            )
        return iter(images)

    def _encode_around_images(
        self, text: str, encode: Callable[[str], list[int]], images: Iterator[np.ndarray]
    ) -> list[int]:
        """``encode(text)``, except that each image mark becomes the next image's ids."""
        first, *rest = text.split(IMAGE_MARK)
        ids = encode(first) if first else []
        for piece in rest:
            ids += self.image_tokens.ids(next(images))
            if piece:
                ids += encode(piece)
        return ids

    def _observation_markup(self, history: Messages) -> tuple[str, str]:
        """The template's markup around a new observation: ``(before, after)``,
        where ``before`` follows the turn close and ``after`` ends with the next
        assistant header."""
        *earlier, last = history
        marked = [*earlier, {**last, "content": _ACTION_MARK}]
        messages = [*marked, {"role": self.observation_role, "content": _OBSERVATION_MARK}]
        rendered = self.render(messages, add_generation_prompt=True)
        name = self.tokenizer.name
        if rendered.count(_ACTION_MARK) != 1:
            raise TemplateError(
                f"the chat template of {name!r} does not render the last assistant message "
                "verbatim once a message follows it (does it render only the last message, or "
                "drop earlier assistant content?). Token-in/token-out needs the action to stay "
                "where the policy wrote it; use format='inline' or fix the template"
            )
        prompt = list(itertools.takewhile(lambda m: m.get("role") != "assistant", earlier))
        head = self.render(prompt, add_generation_prompt=False) if prompt else ""
        if not rendered.startswith(head):
            raise TemplateError(
                f"the chat template of {name!r} does not preserve the prefix: adding a "
                "message changes how the prompt renders, so the ids already given to the "
                "policy no longer match the conversation"
            )
        tail = rendered[rendered.index(_ACTION_MARK) + len(_ACTION_MARK) :]
        close = self._boundary.close_text
        if not tail.startswith(close) or tail.count(_OBSERVATION_MARK) != 1:
            raise TemplateError(
                f"the chat template of {name!r} does not preserve the prefix: once a "
                f"{self.observation_role!r} message follows, the assistant turn no longer "
                f"closes with {close!r} (rendered {tail[:120]!r})"
            )
        before, after = tail[len(close) :].split(_OBSERVATION_MARK)
        return before, after

    def _encode_with_plain_contents(
        self, messages: Messages, text: str, images: Iterator[np.ndarray]
    ) -> list[int]:
        """Encode a render segment by segment: markup with special tokens, message
        contents with special tokens split."""
        marks = [f"VTcontentMark{i}x" for i in range(len(messages))]
        marked = [{**m, "content": mark} for m, mark in zip(messages, marks)]
        skeleton = self.render(marked, add_generation_prompt=True)
        ids: list[int] = []
        rebuilt = ""
        for message, mark in zip(messages, marks):
            markup, found, skeleton = skeleton.partition(mark)
            content = str(message.get("content", ""))
            if not found or not text.startswith(rebuilt + markup + content):
                raise TemplateError(
                    f"the chat template of {self.tokenizer.name!r} does not render message "
                    "contents verbatim, so text that holds special tokens cannot be encoded "
                    "as plain text within it"
                )
            ids += self.tokenizer.encode(markup)
            ids += self._encode_around_images(content, self.tokenizer.encode_text, images)
            rebuilt += markup + content
        return ids + self.tokenizer.encode(skeleton)

    def _probe_prompt(self) -> list[dict[str, str]]:
        """A prompt the template accepts: system + user, or user alone."""
        for prompt in (
            [
                {"role": "system", "content": _PROBE_SYSTEM},
                {"role": "user", "content": _PROBE_USER},
            ],
            [{"role": "user", "content": _PROBE_USER}],
        ):
            try:
                self.render(prompt, add_generation_prompt=True)
                return prompt
            except TemplateError:
                # Some templates reject a system message; the probe needs none.
                continue
        raise TemplateError(
            f"the chat template of {self.tokenizer.name!r} rejects a one-message prompt"
        )

    def _find_boundary(self, prompt: list[dict[str, str]]) -> _Boundary:
        name = self.tokenizer.name
        with_action = [*prompt, {"role": "assistant", "content": _ACTION_MARK}]
        rendered = self.render(with_action, add_generation_prompt=False)
        cut = rendered.rfind(_ACTION_MARK)
        if cut < 0:
            raise TemplateError(
                f"the chat template of {name!r} does not render assistant content verbatim "
                f"(rendered {rendered[-200:]!r}), so the tokens that close an assistant turn "
                "cannot be found"
            )
        close_text = rendered[cut + len(_ACTION_MARK) :]
        head_ids = self.tokenizer.encode(rendered[: cut + len(_ACTION_MARK)])
        all_ids = self.tokenizer.encode(rendered)
        if all_ids[: len(head_ids)] != head_ids:
            raise TemplateError(
                f"the chat template of {name!r} closes assistant turns with text that merges "
                "into the assistant's last tokens; it must start the turn close with a special "
                "token"
            )
        close_ids = all_ids[len(head_ids) :]
        if close_ids != self.tokenizer.encode(close_text):
            raise TemplateError(
                f"the chat template of {name!r} closes assistant turns with {close_text!r}, "
                "whose tokens depend on what precedes them"
            )
        eos = self.tokenizer.eos_token_id
        # A policy that stops at eos generated the turn close up to and
        # including eos; if the template's close lacks eos, it is all added.
        after_eos = close_ids[close_ids.index(eos) + 1 :] if eos in close_ids else close_ids
        without = self.render(prompt, add_generation_prompt=False)
        with_header = self.render(prompt, add_generation_prompt=True)
        header = with_header[len(without) :] if with_header.startswith(without) else ""
        return _Boundary(
            close_text=close_text,
            close_ids=tuple(close_ids),
            after_eos_ids=tuple(after_eos),
            header_ids=tuple(self.tokenizer.encode(header)),
        )

    def __repr__(self) -> str:
        return (
            f"ObservationEncoder(tokenizer={self.tokenizer!r}, format={self.format!r}, "
            f"observation_role={self.observation_role!r})"
        )


def _check_inline_template(template: str) -> None:
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        template.format(text="")
    except (ValueError, KeyError, IndexError) as exc:
        raise InvalidConfigError(
            f"inline_template must be a str.format template with the single field {{text}}; "
            f"{template!r} fails: {exc}"
        ) from exc
    if fields != {"text"}:
        raise InvalidConfigError(
            f"inline_template must contain the single field {{text}} (double literal braces); "
            f"got fields {sorted(fields)} in {template!r}"
        )
