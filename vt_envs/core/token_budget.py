"""How many characters one token can stand for: a bound that lets the env count an
action against ``max_episode_tokens`` without tokenizing more than the budget allows.

The env only needs to know whether an action fits what is left of the budget
(``room`` tokens). If every character of the text is covered by the piece of
some token, and no piece covers more than ``L`` characters, then a text of
``n`` characters has at least ``n / L`` tokens: a text longer than
``room * L`` characters cannot fit, and is refused without being tokenized;
a shorter one is tokenized in full (at most ``room * L`` characters) and
counted exactly. So the decision is exact, and the tokenizer never sees more
than ``room * L`` characters.

:func:`chars_per_token_bound` derives ``L`` from a ``tokenizers.Tokenizer``
(what both :class:`~vt_envs.core.tokenizer.VTTokenizer` and a Hugging Face
*fast* tokenizer run on):

- ``L`` starts as the longest vocabulary entry, in characters. For byte-level
  BPE (GPT-2, Llama 3, Qwen2, the default tokenizer) an entry has one
  character per byte, and a text has no more characters than bytes; for
  SentencePiece-style BPE an entry is the text it stands for (``▁the``) or
  longer (``<0x0A>``, ``##ing``). Added tokens count by their content.
- A normalizer can merge characters: NFC/NFKC compose at most 4 code points
  into one (the longest canonical decomposition), so ``L`` is multiplied by
  4; NFD/NFKD, ``Lowercase`` and ``Prepend`` never shorten the text; a
  ``Replace`` of one character by a non-empty string neither. Any other
  normalizer (``BertNormalizer`` drops control characters, ``StripAccents``
  drops combining marks, SentencePiece's precompiled charsmap) gives no bound.
- A pre-tokenizer must keep every character: ``ByteLevel``, ``Metaspace``,
  ``Digits``, ``UnicodeScripts``, and ``Split`` / ``Punctuation`` unless
  they remove what they match. ``Whitespace``, ``WhitespaceSplit`` and
  ``BertPreTokenizer`` drop whitespace: no bound.
- The model must give every character a token: BPE over a ``ByteLevel``
  pre-tokenizer whose vocabulary holds all 256 byte symbols, BPE with
  ``byte_fallback``, or BPE with an unknown token and no ``fuse_unk`` (one
  ``<unk>`` a character); Unigram with ``byte_fallback``. Without them BPE
  drops unknown characters, and Unigram, WordPiece and WordLevel map a run of
  them, or a whole word, to one unknown token: no bound.

``None`` (no bound) means the env tokenizes every action in full, as before;
slow (pure-Python) Hugging Face tokenizers are in that case too.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["chars_per_token_bound"]

# Code points that NFC/NFKC can compose into one (the longest canonical decomposition).
_COMPOSE = 4
_KEEP_LENGTH = frozenset({"NFD", "NFKD", "Lowercase", "Prepend"})
_KEEP_CHARS = frozenset({"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"})
_SPLITTING = frozenset({"Split", "Punctuation"})


def chars_per_token_bound(tokenizer: Any) -> int | None:
    """The most characters of input text one token of ``tokenizer`` (a
    ``tokenizers.Tokenizer``) can stand for, or ``None`` when no such bound holds
    (see the module docstring for the rules)."""
    try:
        config = json.loads(tokenizer.to_str())
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        added = tokenizer.get_added_tokens_decoder().values()
    except Exception:  # not a `tokenizers` tokenizer we can read
        return None
    factor = _normalizer_factor(config.get("normalizer"))
    if factor is None or not _keeps_chars(config.get("pre_tokenizer")):
        return None
    if not _every_char_has_a_token(config.get("model") or {}, config, vocab):
        return None
    longest = max((len(token) for token in vocab), default=1)
    longest = max([longest, *(len(token.content) for token in added)])
    return max(1, longest) * factor


def _normalizer_factor(normalizer: dict | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1
        for step in normalizer.get("normalizers", ()):
            part = _normalizer_factor(step)
            if part is None:
                return None
            factor *= part
        return factor
    if kind in ("NFC", "NFKC"):
        return _COMPOSE
    if kind in _KEEP_LENGTH:
        return 1
    if kind == "Replace":
        pattern, content = normalizer.get("pattern") or {}, normalizer.get("content")
        one_char = isinstance(pattern.get("String"), str) and len(pattern["String"]) == 1
        return 1 if one_char and isinstance(content, str) and content else None
    return None


def _keeps_chars(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_chars(step) for step in pre_tokenizer.get("pretokenizers", ()))
    if kind in _SPLITTING:
        return pre_tokenizer.get("behavior") != "Removed"
    return kind in _KEEP_CHARS


def _every_char_has_a_token(model: dict, config: dict, vocab: dict[str, int]) -> bool:
    kind = model.get("type")
    if kind == "BPE":
        if model.get("byte_fallback"):
            return True
        if model.get("unk_token") is not None and not model.get("fuse_unk"):
            return True
        return _is_byte_level(config.get("pre_tokenizer")) and _has_every_byte(vocab)
    if kind == "Unigram":
        return bool(model.get("byte_fallback"))
    return False


def _is_byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_is_byte_level(step) for step in pre_tokenizer.get("pretokenizers", ()))
    return pre_tokenizer.get("type") == "ByteLevel"


def _has_every_byte(vocab: dict[str, int]) -> bool:
    from tokenizers.pre_tokenizers import ByteLevel

    return all(symbol in vocab for symbol in ByteLevel.alphabet())
