"""Tokenization, token-in / token-out.

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

The special-token rule: text the policy did not write (tool output, task
prompts, the system prompt) is encoded with special tokens *split*
(:meth:`ChatTokenizer.encode_text`): a tool that prints ``<|im_end|>`` yields
the ordinary tokens of those characters, so no tool output or dataset prompt
can forge a turn. Only the chat template's own markup yields control ids.

The default tokenizer is shipped as package data under
``vt_envs/assets/tokenizer`` (built by ``scripts/build_tokenizer.py``): a
byte-level BPE with 2048 ids, single-token digits and tags, and ChatML.
"""

from __future__ import annotations

import abc
import functools
import itertools
import json
import os
import re
import string
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vt_envs.core.packaged_models import PACKAGED_MODELS, resolve_model
from vt_envs.core.token_budget import chars_per_token_bound
from vt_envs.errors import InvalidConfigError, TemplateError, did_you_mean

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_TOKENIZER_DIR",
    "IMAGE_MARK",
    "IMAGE_TOKEN",
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
#: The default tokenizer's one-id stand-in for an image (a special token).
IMAGE_TOKEN = "<image>"
#: Where an image goes in a message's content, for :class:`ObservationEncoder`
#: (the env writes it; it is stripped from text the env did not write).
IMAGE_MARK = "\x00VTimage\x00"
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
        special_tokens: the strings of the control (special) tokens, which
            :meth:`encode` maps to their ids and :meth:`encode_text` splits.
        max_chars_per_token: the most characters of text one token can stand
            for, or ``None`` when no bound is known (see
            :mod:`vt_envs.core.token_budget`); :meth:`count_up_to` uses it.
    """

    name: str
    vocab_size: int
    eos_token: str
    eos_token_id: int
    pad_token_id: int
    special_tokens: tuple[str, ...]
    max_chars_per_token: int | None = None

    def count_up_to(self, text: str, limit: int) -> int:
        """``len(self.encode(text))`` when that is at most ``limit``, else ``limit + 1``.

        A text longer than ``limit * max_chars_per_token`` characters has more
        than ``limit`` tokens, so it is not encoded at all: the encoder never
        sees more than that many characters (a 10 MB action counted against
        a budget of a few thousand tokens costs nothing). Without a known
        bound the text is encoded in full.
        """
        limit = max(0, int(limit))
        bound = self.max_chars_per_token
        if bound is not None and len(text) > limit * bound:
            return limit + 1
        return min(len(self.encode(text)), limit + 1)

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Return the ids of ``text``. Adds no BOS/EOS; special-token strings
        inside ``text`` (``<|im_end|>``) map to their ids. For template markup
        and policy-written text."""

    @abc.abstractmethod
    def encode_text(self, text: str) -> list[int]:
        """Return the ids of ``text`` with special-token strings split into
        ordinary tokens, so ``decode`` gives ``text`` back but no control id
        appears. For text the policy did not write (tool output, prompts)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Return the text of ``ids``, special tokens kept."""

    def encode_with_text(self, text: str) -> tuple[list[int], str]:
        """``(encode(text), decode(encode(text)))``; a tokenizer that knows the
        decode gives ``text`` back may skip it."""
        ids = self.encode(text)
        return ids, self.decode(ids)

    @abc.abstractmethod
    def apply_chat_template(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) as text.

        ``tools`` (function specs) and ``template_kwargs`` (``enable_thinking``
        ...) are passed to the template as variables. Raises
        :class:`TemplateError` if the template rejects the messages.
        """

    def contains_special(self, text: str) -> bool:
        """Whether ``text`` contains the string of a special token."""
        return any(token in text for token in self.special_tokens)

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
        self.special_tokens = tuple(
            t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special
        )
        # A twin that treats special-token strings as plain text (encode_text).
        self._plain = type(tokenizer).from_str(tokenizer.to_str())
        self._plain.encode_special_tokens = True
        self._pieces = _PieceCache.for_tokenizer(tokenizer)
        self.max_chars_per_token = chars_per_token_bound(tokenizer)

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
        if self._pieces is not None:
            return self._pieces.encode(text)[0]
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_with_text(self, text: str) -> tuple[list[int], str]:
        if self._pieces is not None:
            ids, lossless = self._pieces.encode(text)
            if lossless:  # every piece was checked to decode to itself
                return ids, text
            return ids, self.decode(ids)
        return super().encode_with_text(text)

    def encode_text(self, text: str) -> list[int]:
        if self._pieces is not None and not self.contains_special(text):
            return self._pieces.encode(text)[0]  # no special token to split: the same ids
        return self._plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode(_as_id_list(ids), skip_special_tokens=False)

    def apply_chat_template(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        try:
            return self._template.render(
                **template_kwargs,
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                eos_token=self.eos_token,
                pad_token=self.pad_token,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(
                f"rendering the chat template of {self.name!r} failed: {exc}"
            ) from exc


class _PieceCache:
    """``tokenizer.encode`` piece by piece, the pieces between added tokens cached.

    ``tokenizers`` splits its input at added tokens before anything else and
    encodes each piece on its own, so encoding a render piece by piece gives
    the same ids, and a piece seen before (a system prompt with its tool
    descriptions, a template's markup) is not encoded again. Used only for
    a tokenizer where that holds by construction (no normalizer; no added
    token strips whitespace or matches only whole words) and is confirmed on
    probes; :meth:`for_tokenizer` returns ``None`` otherwise.
    """

    _MAX_PIECES = 2048
    #: Longer pieces are encoded but not kept (a long action is seen once; the cache
    #: is for what repeats: prompts, markup), so it holds at most ~128M characters.
    _MAX_PIECE_CHARS = 1 << 16

    def __init__(self, tokenizer: Any, added: Mapping[str, int]):
        self._tokenizer = tokenizer
        self._added = dict(added)
        # Longest first: the leftmost-longest match, as the tokenizer's own splitter.
        alternatives = sorted(added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")").split
        # piece -> (its ids, whether they decode to the piece itself)
        self._cache: dict[str, tuple[tuple[int, ...], bool]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> _PieceCache | None:
        tokens = tokenizer.get_added_tokens_decoder()
        if not tokens or getattr(tokenizer, "normalizer", None) is not None:
            return None
        if any(t.lstrip or t.rstrip or t.single_word for t in tokens.values()):
            return None
        if _overlapping({t.content for t in tokens.values()}):
            return None  # which of two overlapping tokens wins is the tokenizer's own rule
        cache = cls(tokenizer, {t.content: i for i, t in tokens.items()})
        for content in cache._added:
            probe = f"a {content} b\n{content}\n\n x{content}{content}y \t{content}  "
            if cache.encode(probe)[0] != tokenizer.encode(probe, add_special_tokens=False).ids:
                return None
        return cache

    def encode(self, text: str) -> tuple[list[int], bool]:
        """``text``'s ids, and whether decoding them gives ``text`` back."""
        ids: list[int] = []
        lossless = True
        for i, piece in enumerate(self._split(text)):
            if i % 2:  # an added token (the split's captured separators)
                ids.append(self._added[piece])
            elif piece:
                known = self._cache.get(piece)
                if known is None:
                    piece_ids = tuple(self._tokenizer.encode(piece, add_special_tokens=False).ids)
                    known = piece_ids, self._tokenizer.decode(piece_ids) == piece
                    if len(piece) <= self._MAX_PIECE_CHARS:
                        if len(self._cache) >= self._MAX_PIECES:  # first in, first out
                            del self._cache[next(iter(self._cache))]
                        self._cache[piece] = known
                ids.extend(known[0])
                lossless = lossless and known[1]
        return ids, lossless


def _overlapping(contents: set[str]) -> bool:
    """Whether an added token's text overlaps another's (one holds the other, or one
    ends with how the other begins)."""
    for a in contents:
        for b in contents:
            if a != b and (a in b or any(a.endswith(b[:k]) for k in range(1, len(b)))):
                return True
    return False


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
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        self.special_tokens = tuple(
            dict.fromkeys([*(t.content for t in added if t.special), *tokenizer.all_special_tokens])
        )
        if getattr(tokenizer, "is_fast", False):  # a slow one runs in Python: no bound read
            self.max_chars_per_token = chars_per_token_bound(tokenizer.backend_tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode_text(self, text: str) -> list[int]:
        return list(
            self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        )

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode(
            _as_id_list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def apply_chat_template(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        try:
            return self._tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=[dict(t) for t in tools] if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
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
    "a packaged model's name or the path of a local tokenizer directory"
)


def load_tokenizer(spec: Any = None) -> ChatTokenizer:
    """Turn what a user passes as ``tokenizer=`` into a :class:`ChatTokenizer`.

    - ``None``: the shipped default (:func:`default_tokenizer`);
    - a :class:`ChatTokenizer`: itself;
    - a Hugging Face tokenizer object: :class:`HFTokenizer`;
    - the name of a packaged model (``"smollm2-135m-instruct"``,
      :mod:`vt_envs.core.packaged_models`): its built directory's tokenizer;
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
        return _load_dir(Path(resolve_model(spec)))
    raise InvalidConfigError(
        f"tokenizer must be {_EXPECTED}; got {type(spec).__name__}: {repr(spec)[:80]}"
    )


def _load_dir(path: Path) -> ChatTokenizer:
    if not path.is_dir():
        raise InvalidConfigError(
            f"tokenizer must be {_EXPECTED}; {str(path)!r} is not a local directory nor a "
            f"packaged model ({', '.join(PACKAGED_MODELS)}). Nothing is downloaded: load a hub "
            "tokenizer yourself (AutoTokenizer.from_pretrained) and pass the object"
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


# Stand-ins rendered in place of the last action and of the new observation, to
# find where they sit in a render. Plain words: templates render them verbatim.
_ACTION_MARK = "VTactionMark7c1e"
_OBSERVATION_MARK = "VTobservationMark5e2b"
# The probe conversation checked at construction, so that a template or a
# tokenizer the encoder cannot serve fails there, not in the middle of an episode.
_PROBE_SYSTEM = "You are a helpful assistant."
_PROBE_USER = "Hi."


#: Prompts an :class:`ObservationEncoder` keeps encoded (about 30 KB each at 2,700 tokens).
PROMPT_CACHE_SIZE = 256


def _messages_key(messages: Messages) -> tuple | None:
    """A key for ``messages`` whose keys and values are all strings, else ``None``
    (``1``, ``1.0`` and ``True`` are equal keys but render differently)."""
    for message in messages:
        for name, value in message.items():
            if type(name) is not str or type(value) is not str:
                return None
    return tuple(tuple(sorted(m.items())) for m in messages)


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
        tokenizer: anything :func:`load_tokenizer` accepts.
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
            encode contents that hold :data:`IMAGE_MARK`.

    Images: wherever a message's content (or an observation's text) holds
    :data:`IMAGE_MARK`, the next of the ``images`` given is spliced in as
    ``image_tokens.ids(image)``; the text around it is encoded on its own, as a
    tokenizer does around a special token.

    Every method returns ``(ids, text)`` with ``ids`` an ``int64`` array and
    ``text == tokenizer.decode(ids)``. Message contents are encoded with
    :meth:`ChatTokenizer.encode_text` (special tokens split) wherever they
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

        Prompts without images are kept (the latest :data:`PROMPT_CACHE_SIZE`,
        by their messages): a task reset again, as in a GRPO group, is not
        rendered or tokenized again. The ids returned are a copy.
        """
        key = None if images else _messages_key(messages)
        if key is not None:
            kept = self._prompts.get(key)
            if kept is not None:
                self._prompts.move_to_end(key)
                return kept[0].copy(), kept[1]
        ids, text = self._encode_prompt(messages, images)
        if key is not None:
            self._prompts[key] = (ids.copy(), text)
            while len(self._prompts) > PROMPT_CACHE_SIZE:
                self._prompts.popitem(last=False)
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
