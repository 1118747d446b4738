"""Tokenization, token-in / token-out.

The env turns everything *between* two actions into token ids; the policy's
generated ids are never re-tokenized. Two pieces live here:

- :class:`ChatTokenizer`, the small interface the env needs (encode, decode,
  render a chat template), with :class:`VTTokenizer` (a ``tokenizers``
  tokenizer + a jinja2 chat template, no ``transformers`` needed) and
  :class:`HFTokenizer` (any Hugging Face tokenizer). :func:`load_tokenizer`
  turns what a user passes to ``gym.make(..., tokenizer=...)`` into one.
- :class:`~vt_envs.core.observation_encoder.ObservationEncoder` (in its own
  module, importable from here too), which produces the ids of the prompt and
  of each observation, so that ``prompt + action_1 + obs_1 + action_2 + ...``
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
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vt_envs.core.packaged_models import PACKAGED_MODELS, resolve_model
from vt_envs.core.token_budget import chars_per_token_bound
from vt_envs.errors import InvalidConfigError, TemplateError

if TYPE_CHECKING:
    from vt_envs.core.observation_encoder import ObservationEncoder

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
# The tags the shipped tokenizer encodes as one id each: those of the built-in
# domains' tools and answers and of common tool-call formats (ids 2028-2047, an
# opening and a closing tag per name, in this order). Nothing in the env reads
# this list, and a domain's tags work with any tokenizer (they are just more
# tokens). It is declared here, beside DEFAULT_TOKENIZER_DIR, because it is part
# of that shipped vocabulary: scripts/build_tokenizer.py adds exactly these
# tokens, so adding, removing or reordering a name changes the shipped ids
# (rebuild the tokenizer; models trained on the old ids are then stale).
# tests/core/test_tokenizer.py checks it against the shipped tokenizer.json.
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


def __getattr__(name: str) -> Any:
    # ObservationEncoder lives in vt_envs.core.observation_encoder, which imports
    # this module; importing it here lazily keeps `from vt_envs.core.tokenizer
    # import ObservationEncoder` working without an import cycle.
    if name == "ObservationEncoder":
        from vt_envs.core.observation_encoder import ObservationEncoder

        return ObservationEncoder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
