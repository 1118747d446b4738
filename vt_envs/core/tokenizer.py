"""Tokenization, token-in / token-out (DESIGN 2.2).

The env turns everything *between* two actions into token ids; the policy's
generated ids are never re-tokenized. Two pieces live here:

- :class:`ChatTokenizer`, the small interface the env needs (encode, decode,
  render a chat template), with :class:`VTTokenizer` (a ``tokenizers``
  tokenizer + a jinja2 chat template, no ``transformers`` needed) and
  :class:`HFTokenizer` (any Hugging Face tokenizer). :func:`load_tokenizer`
  turns what a user passes to ``gym.make(..., tokenizer=...)`` into one.
- :class:`ObservationEncoder`, which produces the ids of the prompt and of
  each observation, so that ``prompt + action_1 + obs_1 + action_2 + ...``
  decodes to the transcript the chat template renders for that conversation.

The default tokenizer is shipped as package data under
``vt_envs/assets/tokenizer`` (built by ``scripts/build_tokenizer.py``): a
byte-level BPE with 2048 ids, single-token digits and tags, and ChatML.
"""

from __future__ import annotations

import abc
import functools
import json
import os
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vt_envs.errors import InvalidConfigError, TemplateError, did_you_mean

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_TOKENIZER_DIR",
    "OBSERVATION_FORMATS",
    "SPECIAL_TOKENS",
    "TAG_TOKENS",
    "ChatTokenizer",
    "HFTokenizer",
    "ObservationEncoder",
    "VTTokenizer",
    "default_tokenizer",
    "load_tokenizer",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TAG_NAMES = (
    *("python", "sql", "search", "lookup", "answer"),
    *("tool_call", "output", "result", "information", "think"),
)
TAG_TOKENS = tuple(tag for name in _TAG_NAMES for tag in (f"<{name}>", f"</{name}>"))
DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
OBSERVATION_FORMATS = ("chat", "inline")

Messages = Sequence[Mapping[str, Any]]


class ChatTokenizer(abc.ABC):
    """What the env needs from a tokenizer.

    Attributes:
        name: a human-readable name (a path or model id).
        vocab_size: the size of an embedding table that fits every id the
            tokenizer can produce, added tokens included.
        eos_token / eos_token_id: the token that ends an assistant turn.
        pad_token_id: the id to pad batches with (``eos_token_id`` if the
            tokenizer has no pad token).
    """

    name: str
    vocab_size: int
    eos_token: str
    eos_token_id: int
    pad_token_id: int

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Return the ids of ``text``. Adds no BOS/EOS; special-token strings
        inside ``text`` (``<|im_end|>``) map to their ids."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Return the text of ``ids``, special tokens kept."""

    @abc.abstractmethod
    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) as text;
        raises :class:`TemplateError` if the template rejects them."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template raised: {message}")


@functools.lru_cache(maxsize=32)
def _compile_template(source: str) -> jinja2.Template:
    # The same environment settings as transformers, so a template renders
    # identically here and in ``PreTrainedTokenizerBase.apply_chat_template``.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"the chat template is not valid jinja2: {exc}") from exc


def _as_id_list(ids: Sequence[int] | np.ndarray) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]


class VTTokenizer(ChatTokenizer):
    """A ``tokenizers.Tokenizer`` plus a jinja2 chat template; needs no ``transformers``.

    Args:
        tokenizer: the ``tokenizers.Tokenizer`` (its ``tokenizer.json``).
        chat_template: jinja2 source, rendered like Hugging Face renders it
            (``messages``, ``add_generation_prompt`` and the special tokens as
            variables).
        eos_token: the token that ends an assistant turn; must be in the vocab.
        pad_token: the padding token (default: ``eos_token``).
        name: shown in reprs and errors.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str,
        *,
        eos_token: str,
        pad_token: str | None = None,
        name: str = "vt",
    ):
        self._tokenizer = tokenizer
        self._template = _compile_template(chat_template)
        self.chat_template = chat_template
        self.name = name
        self.eos_token = eos_token
        self.pad_token = pad_token or eos_token
        self.eos_token_id = self._token_id(eos_token, "eos_token")
        self.pad_token_id = self._token_id(self.pad_token, "pad_token")
        self.vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1

    def _token_id(self, token: str, role: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise InvalidConfigError(
                f"{role} {token!r} of tokenizer {self.name!r} is not in its vocabulary; "
                "add it as a special token or name one that exists"
            )
        return token_id

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str], *, name: str | None = None) -> VTTokenizer:
        """Load ``tokenizer.json`` and ``tokenizer_config.json`` (``chat_template``,
        ``eos_token``, ``pad_token``) from a directory saved in the Hugging Face
        layout. Raises :class:`TemplateError` if there is no chat template."""
        from tokenizers import Tokenizer

        path = Path(path)
        config = _read_config(path)
        template = _find_chat_template(path, config)
        if template is None:
            raise TemplateError(
                f"tokenizer at {str(path)!r} has no chat template; expected 'chat_template' in "
                "tokenizer_config.json or a chat_template.jinja file"
            )
        eos = _token_content(config.get("eos_token"))
        if eos is None:
            raise InvalidConfigError(
                f"tokenizer_config.json in {str(path)!r} names no eos_token; the env needs it "
                "to close assistant turns"
            )
        return cls(
            Tokenizer.from_file(str(path / "tokenizer.json")),
            template,
            eos_token=eos,
            pad_token=_token_content(config.get("pad_token")),
            name=name or str(path),
        )

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode(_as_id_list(ids), skip_special_tokens=False)

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                eos_token=self.eos_token,
                pad_token=self.pad_token,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(
                f"rendering the chat template of {self.name!r} failed: {exc}"
            ) from exc


class HFTokenizer(ChatTokenizer):
    """Adapts a Hugging Face ``PreTrainedTokenizerBase`` (fast or slow).

    Raises :class:`TemplateError` if the tokenizer has no chat template and
    :class:`InvalidConfigError` if it has no eos token.
    """

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self.name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"Hugging Face tokenizer {self.name!r} has no chat template; set "
                "tokenizer.chat_template or use a chat model's tokenizer"
            )
        if tokenizer.eos_token_id is None:
            raise InvalidConfigError(
                f"Hugging Face tokenizer {self.name!r} has no eos_token; set tokenizer.eos_token"
            )
        self.eos_token = str(tokenizer.eos_token)
        self.eos_token_id = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_token_id = self.eos_token_id if pad is None else int(pad)
        self.vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode(
            _as_id_list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        try:
            return self._tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except (ValueError, jinja2.TemplateError) as exc:
            raise TemplateError(
                f"rendering the chat template of {self.name!r} failed: {exc}"
            ) from exc


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    with config_file.open(encoding="utf-8") as f:
        return json.load(f)


def _find_chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not template and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    return template or None


def _token_content(token: Any) -> str | None:
    if isinstance(token, dict):  # an AddedToken saved as a dict
        return token.get("content")
    return token


@functools.lru_cache(maxsize=1)
def default_tokenizer() -> VTTokenizer:
    """The shipped offline tokenizer (loaded once per process)."""
    return VTTokenizer.from_dir(DEFAULT_TOKENIZER_DIR, name="vt-bpe-2048")


def _is_hf_tokenizer(obj: Any) -> bool:
    # Only look if transformers is already imported: an HF tokenizer object
    # cannot exist otherwise, and importing it here would cost seconds.
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(obj, transformers.PreTrainedTokenizerBase)


_EXPECTED = (
    "None (the shipped default), a ChatTokenizer, a Hugging Face tokenizer object, "
    "or the path of a local tokenizer directory"
)


def load_tokenizer(spec: Any = None) -> ChatTokenizer:
    """Turn what a user passes as ``tokenizer=`` into a :class:`ChatTokenizer`.

    - ``None``: the shipped default (:func:`default_tokenizer`);
    - a :class:`ChatTokenizer`: itself;
    - a Hugging Face tokenizer object: :class:`HFTokenizer`;
    - a path (``str`` / ``PathLike``) to a local directory: :class:`VTTokenizer`
      if it holds ``tokenizer.json`` and a chat template, otherwise
      ``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)``
      if ``transformers`` is installed.

    Raises :class:`InvalidConfigError` for anything else (hub ids included:
    nothing is downloaded) and :class:`TemplateError` for a tokenizer without
    a chat template.
    """
    if spec is None:
        return default_tokenizer()
    if isinstance(spec, ChatTokenizer):
        return spec
    if _is_hf_tokenizer(spec):
        return HFTokenizer(spec)
    if isinstance(spec, (str, os.PathLike)):
        return _load_dir(Path(spec))
    raise InvalidConfigError(
        f"tokenizer must be {_EXPECTED}; got {type(spec).__name__}: {repr(spec)[:80]}"
    )


def _load_dir(path: Path) -> ChatTokenizer:
    if not path.is_dir():
        raise InvalidConfigError(
            f"tokenizer must be {_EXPECTED}; {str(path)!r} is not a local directory. Nothing is "
            "downloaded: load a hub tokenizer yourself (AutoTokenizer.from_pretrained) and pass "
            "the object"
        )
    has_json = (path / "tokenizer.json").is_file()
    if has_json and _find_chat_template(path, _read_config(path)) is not None:
        return VTTokenizer.from_dir(path)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        if has_json:  # VTTokenizer.from_dir names the missing template
            return VTTokenizer.from_dir(path)
        raise InvalidConfigError(
            f"{str(path)!r} has no tokenizer.json; install transformers to load other "
            "tokenizer formats, or pass a tokenizer object"
        ) from None
    return HFTokenizer(AutoTokenizer.from_pretrained(str(path), local_files_only=True))


# A fixed conversation whose renders are diffed. The reply is plain text so
# that templates render it verbatim and it can be found in the render.
_BASE_SYSTEM = "You are a helpful assistant."
_BASE_USER = "Hi."
_BASE_REPLY = "Hello, how can I help?"


@dataclass(frozen=True)
class _Boundary:
    """What the template renders around an assistant message (cached per encoder)."""

    base_messages: tuple[Mapping[str, str], ...]
    base_text: str
    base_ids: tuple[int, ...]
    close_ids: tuple[int, ...]  # closes an assistant turn: ``<|im_end|>\n`` in ChatML
    after_eos_ids: tuple[int, ...]  # the part of close_ids after the eos token: ``\n``


def _array(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64).reshape(-1)


class ObservationEncoder:
    """Encodes prompts and observations token-in / token-out.

    Args:
        tokenizer: anything :func:`load_tokenizer` accepts.
        format: ``"chat"`` (the observation is a new ``observation_role``
            message, rendered by the chat template) or ``"inline"`` (ToRL
            style: ``inline_template.format(text=text)`` inside the assistant
            turn, with no turn boundary).
        observation_role: the role of observation messages in ``chat``.
        inline_template: must contain the single field ``{text}``; literal
            braces are doubled, as in ``str.format``.

    Every method returns ``(ids, text)`` with ``ids`` an ``int64`` array and
    ``text == tokenizer.decode(ids)``. Raises :class:`TemplateError` at
    construction if the chat template cannot be diffed (it does not render an
    assistant message verbatim, or rejects the fixed base conversation).
    """

    def __init__(
        self,
        tokenizer: Any = None,
        format: str = "chat",
        *,
        observation_role: str = "tool",
        inline_template: str = "\n<output>\n{text}\n</output>\n",
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
        self._boundary = self._find_boundary()
        if format == "chat":
            self._message_ids("probe")  # fail now, not mid-episode, if the diff cannot work

    def encode_prompt(self, messages: Messages) -> tuple[np.ndarray, str]:
        """The whole prompt, rendered with the generation prompt (it ends with
        the assistant header, ready to generate)."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self._pair(self.tokenizer.encode(text))

    def encode_observation(
        self, text: str, *, action_ended_with_eos: bool
    ) -> tuple[np.ndarray, str]:
        """The ids to append after an action's generated ids.

        ``chat``: the tokens that close the assistant turn (all of them, or
        only those after the eos token if the action already ended with it),
        then the observation message, then the next assistant header.
        ``inline``: ``inline_template.format(text=text)`` encoded on its own;
        ``action_ended_with_eos`` is ignored (no turn boundary is added).
        """
        if self.format == "inline":
            return self._pair(self.tokenizer.encode(self.inline_template.format(text=text)))
        return self._pair(self._close(action_ended_with_eos) + self._message_ids(text))

    def encode_final(self, *, action_ended_with_eos: bool) -> tuple[np.ndarray, str]:
        """The tokens that close the last assistant turn of an episode (the
        same in both formats; empty if the action already ended with eos and
        the template adds nothing after it)."""
        return self._pair(self._close(action_ended_with_eos))

    # -- internals ---------------------------------------------------------

    def _pair(self, ids: Sequence[int]) -> tuple[np.ndarray, str]:
        return _array(ids), self.tokenizer.decode(list(ids))

    def _close(self, action_ended_with_eos: bool) -> list[int]:
        b = self._boundary
        return list(b.after_eos_ids if action_ended_with_eos else b.close_ids)

    def _message_ids(self, text: str) -> list[int]:
        """Suffix diff: the ids the template adds for one more message (and
        the generation prompt) after the base conversation."""
        b = self._boundary
        messages = [*b.base_messages, {"role": self.observation_role, "content": text}]
        full_text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if not full_text.startswith(b.base_text):
            raise TemplateError(
                f"the chat template of {self.tokenizer.name!r} does not preserve the prefix: "
                "adding a message changes how earlier messages render (does it render only "
                "the last message, or rewrite earlier assistant content?). Token-in/token-out "
                "needs a template that only appends; use format='inline' or fix the template"
            )
        full_ids = self.tokenizer.encode(full_text)
        n = len(b.base_ids)
        if tuple(full_ids[:n]) != b.base_ids:
            raise TemplateError(
                f"the chat template of {self.tokenizer.name!r} preserves the prefix as text but "
                "not as tokens: the tokens of the new message merge with the end of the "
                "previous turn. The template must end each turn with a special token"
            )
        return full_ids[n:]

    def _render_base(self) -> tuple[list[dict[str, str]], str]:
        conversation = [
            {"role": "system", "content": _BASE_SYSTEM},
            {"role": "user", "content": _BASE_USER},
            {"role": "assistant", "content": _BASE_REPLY},
        ]
        try:
            return conversation, self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=False
            )
        except TemplateError:
            # Some templates reject a system message; the diff needs none.
            conversation = conversation[1:]
            return conversation, self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=False
            )

    def _find_boundary(self) -> _Boundary:
        messages, base_text = self._render_base()
        cut = base_text.rfind(_BASE_REPLY)
        if cut < 0:
            raise TemplateError(
                f"the chat template of {self.tokenizer.name!r} does not render assistant "
                f"content verbatim (rendered {base_text[-200:]!r}), so the tokens that close "
                "an assistant turn cannot be found"
            )
        head_ids = self.tokenizer.encode(base_text[: cut + len(_BASE_REPLY)])
        base_ids = self.tokenizer.encode(base_text)
        if base_ids[: len(head_ids)] != head_ids:
            raise TemplateError(
                f"the chat template of {self.tokenizer.name!r} closes assistant turns with "
                "text that merges into the assistant's last tokens; it must start the turn "
                "close with a special token"
            )
        close_ids = base_ids[len(head_ids) :]
        eos = self.tokenizer.eos_token_id
        # A policy that stops at eos generated the turn close up to and
        # including eos; if the template's close lacks eos, it is all added.
        after_eos = close_ids[close_ids.index(eos) + 1 :] if eos in close_ids else close_ids
        return _Boundary(
            base_messages=tuple(messages),
            base_text=base_text,
            base_ids=tuple(base_ids),
            close_ids=tuple(close_ids),
            after_eos_ids=tuple(after_eos),
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
