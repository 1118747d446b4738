"""vt_envs.core.token_budget: the characters-per-token bound and ``count_up_to``.

The bound is what lets the env refuse a 10 MB action without tokenizing it, so it
must be sound: every tokenizer given a bound has at least ``len(text) / bound``
tokens on any text (checked on adversarial text), and tokenizers that can drop or
merge characters (whitespace-splitting pre-tokenizers, BERT normalization,
WordPiece's whole-word ``[UNK]``) get none.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from vt_envs.core.token_budget import chars_per_token_bound
from vt_envs.core.tokenizer import default_tokenizer

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=200)
CORPUS = [
    "the quick brown fox jumps over the lazy dog " * 20,
    "def f(x):\n    return x * x  # squares\n" * 20,
    "café naïve résumé Ελληνικά русский 中文 😀 " * 20,
]
# Text a bound must survive: whitespace and control runs, combining marks (NFC
# composes them), Hangul jamo, emoji sequences, digits, unknown scripts.
TRICKY = st.text(
    alphabet=st.sampled_from(
        [
            *(" ", "\t", "\n", "\x00", "\x07", "\u0301", "\u0308", "e", "a", "\u1100"),
            *("\u1161", "\u11a8", "😀", "\u200d", "7", "ꙮ", "𒀀", "ﷺ", "İ", "ß", "x", "<", "|"),
        ]
    ),
    max_size=300,
)


def _bpe(normalizer=None, pre_tokenizer=None, **model) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(**model))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    special = [model["unk_token"]] if model.get("unk_token") else []
    alphabet = pre_tokenizers.ByteLevel.alphabet() if _byte_level(pre_tokenizer) else []
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet, special_tokens=special)
    tokenizer.train_from_iterator(CORPUS, trainer)
    if _byte_level(pre_tokenizer):
        tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _byte_level(pre_tokenizer) -> bool:
    return pre_tokenizer is not None and "ByteLevel" in repr(pre_tokenizer)


BOUNDED = {
    "byte_level": lambda: _bpe(pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False)),
    "nfc_byte_level": lambda: _bpe(  # Qwen2's layout: NFC, then a regex split and bytes
        normalizers.NFC(),
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(r"\s+|\p{L}+|\p{N}", behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
    ),
    "unk_per_char": lambda: _bpe(unk_token="<unk>", fuse_unk=False),
    "metaspace_unk": lambda: _bpe(
        normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
        pre_tokenizers.Metaspace(),
        unk_token="<unk>",
    ),
}
UNBOUNDED = {
    # drops whitespace: 10 MB of spaces would be no token at all
    "whitespace_split": lambda: _bpe(pre_tokenizer=pre_tokenizers.WhitespaceSplit()),
    # drops control characters and accents
    "bert_normalizer": lambda: _bpe(normalizers.BertNormalizer(), unk_token="<unk>"),
    "strip_accents": lambda: _bpe(normalizers.StripAccents(), unk_token="<unk>"),
    # a run of unknown characters is one <unk>
    "fused_unk": lambda: _bpe(unk_token="<unk>", fuse_unk=True),
    # unknown characters are dropped
    "no_unk_no_bytes": lambda: _bpe(),
    "removing_split": lambda: _bpe(
        pre_tokenizer=pre_tokenizers.Split(" ", behavior="removed"), unk_token="<unk>"
    ),
}


def test_the_default_tokenizer_has_a_bound():
    tokenizer = default_tokenizer()
    assert tokenizer.max_chars_per_token == chars_per_token_bound(tokenizer._tokenizer) == 14


@pytest.mark.parametrize("name", list(UNBOUNDED))
def test_tokenizers_that_drop_or_merge_characters_get_no_bound(name):
    assert chars_per_token_bound(UNBOUNDED[name]()) is None


@pytest.mark.parametrize("name", list(BOUNDED))
def test_a_bounded_tokenizer_has_at_least_len_over_bound_tokens(name):
    tokenizer = BOUNDED[name]()
    bound = chars_per_token_bound(tokenizer)
    assert bound is not None

    @SETTINGS
    @given(TRICKY)
    def holds(text):
        assert len(tokenizer.encode(text).ids) * bound >= len(text), (text, bound)

    holds()
    for text in (" " * 5000, "\u0301" * 5000, "e\u0301" * 2000, "\u1100\u1161\u11a8" * 1000):
        assert len(tokenizer.encode(text).ids) * bound >= len(text)


@SETTINGS
@given(st.text(max_size=200), st.integers(min_value=-3, max_value=120))
def test_count_up_to_is_exact_up_to_the_limit(text, limit):
    tokenizer = default_tokenizer()
    exact = len(tokenizer.encode(text))
    assert tokenizer.count_up_to(text, limit) == min(exact, max(limit, 0) + 1)


def test_count_up_to_never_encodes_a_text_provably_over_the_limit(monkeypatch):
    tokenizer = default_tokenizer()
    seen: list[int] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: seen.append(len(text)) or encode(text))
    assert tokenizer.count_up_to("a" * 10_000_000, 100) == 101
    assert seen == []
    assert tokenizer.count_up_to("a" * 1400, 100) <= 101 and seen == [1400]  # within: encoded
