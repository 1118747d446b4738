"""Tests for vt_envs.core.tokenizer: the shipped tokenizer and token-in/token-out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from vt_envs.core.tokenizer import (
    CHATML_TEMPLATE,
    DEFAULT_TOKENIZER_DIR,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    ChatTokenizer,
    ObservationEncoder,
    VTTokenizer,
    load_tokenizer,
)
from vt_envs.errors import InvalidConfigError, TemplateError, VTError

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces that stress a byte-level tokenizer: emoji (incl. ZWJ sequences),
# NUL, control characters, whitespace runs, non-BMP, combining marks, tags.
TRICKY = [
    "\x00",
    "😀",
    "\U0001f469\u200d\U0001f469\u200d\U0001f467",
    "\u00a0",
    "\t\t",
    "   ",
    "\n\n\n",
    "\r\n",
    "é",
    "e\u0301",
    "中文",
    "\U0001f600\U0010ffff",
    "\ufffd",
    "\x7f",
    "'s",
    "123",
    "<|im_end|>",
    "<|endoftext|>",
    "<python>",
    "</answer>",
    '{"a": 1}',
]
unicode_text = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(TRICKY)), max_size=10).map(
    "".join
)


@pytest.fixture(scope="module")
def vt() -> ChatTokenizer:
    return load_tokenizer()


def _small_chatml_dir(root: Path) -> Path:
    """A second ChatML tokenizer with another vocabulary: GPT-2 style byte-level
    BPE, 300 ids, special tokens at the end of the vocabulary."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=297, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    sentences = [
        "the cat sat on the mat",
        "a tool returns an observation",
        "print(1 + 2)",
        "select the answer from a table of flights",
        "an assistant writes python code",
    ] * 5
    tokenizer.train_from_iterator(sentences, trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    root.mkdir()
    tokenizer.save(str(root / "tokenizer.json"))
    config = {"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>"}
    (root / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return root


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return load_tokenizer(_small_chatml_dir(tmp_path_factory.mktemp("tok") / "small"))


def _with_template(template: str) -> VTTokenizer:
    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))
    return VTTokenizer(tokenizer, template, eos_token="<|im_end|>", name="custom")


# -- the shipped tokenizer ---------------------------------------------------


@SETTINGS
@given(unicode_text)
def test_round_trip_is_lossless(text: str) -> None:
    tokenizer = load_tokenizer()
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_shipped_tokenizer_facts(vt: ChatTokenizer) -> None:
    assert isinstance(vt, VTTokenizer)
    assert vt.vocab_size == 2048
    assert (vt.eos_token, vt.eos_token_id) == ("<|im_end|>", vt.encode("<|im_end|>")[0])
    assert vt.pad_token_id == vt.encode("<|endoftext|>")[0] != vt.eos_token_id
    assert load_tokenizer() is vt  # loaded once per process
    assert load_tokenizer(vt) is vt
    config = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer_config.json").read_text("utf-8"))
    assert config["chat_template"] == CHATML_TEMPLATE
    assert vt.encode("") == []


def test_no_token_merges_a_digit(vt: ChatTokenizer) -> None:
    # Exhaustive over the vocabulary: a token that contains a digit is that digit.
    for token_id in range(vt.vocab_size):
        piece = vt.decode([token_id])
        assert not any(c.isdigit() for c in piece) or piece in "0123456789", (token_id, piece)
    for digit in "0123456789":
        assert len(vt.encode(digit)) == 1
    assert vt.encode("x=90210;")[2:7] == [vt.encode(d)[0] for d in "90210"]


def test_tag_tokens_are_the_shipped_tokenizers_plain_added_tokens() -> None:
    # TAG_TOKENS is declared in the core because it is part of the shipped
    # vocabulary: the last 20 ids, in its order (scripts/build_tokenizer.py).
    data = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    added = sorted(data["added_tokens"], key=lambda token: token["id"])
    plain = [(token["id"], token["content"]) for token in added if not token["special"]]
    assert plain == list(enumerate(TAG_TOKENS, start=2048 - len(TAG_TOKENS)))


@pytest.mark.parametrize("token", SPECIAL_TOKENS + TAG_TOKENS)
def test_tags_and_special_tokens_are_single_tokens(vt: ChatTokenizer, token: str) -> None:
    (token_id,) = vt.encode(token)
    ids = vt.encode(f"a {token}b")
    assert token_id in ids and vt.decode(ids) == f"a {token}b"


def test_shipped_assets_load_without_transformers() -> None:
    code = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of it fails
        "from vt_envs.core.tokenizer import load_tokenizer, ObservationEncoder\n"
        "t = load_tokenizer(); ObservationEncoder(t)\n"
        "print(t.vocab_size, t.decode(t.encode('<sql>1</sql>')))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["2048", "<sql>1</sql>"]


def test_encode_prompt_ends_with_assistant_header(vt: ChatTokenizer) -> None:
    ids, text = ObservationEncoder(vt).encode_prompt([{"role": "user", "content": "2+2?"}])
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert ids.dtype == np.int64 and ids.ndim == 1 and vt.decode(ids) == text


HISTORY = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<sql>"}]


def test_chat_observation_closes_the_turn(vt: ChatTokenizer) -> None:
    encoder = ObservationEncoder(vt)
    ids, text = encoder.encode_observation("4", history=HISTORY, action_ended_with_eos=False)
    assert text == "<|im_end|>\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == vt.eos_token_id and vt.decode(ids) == text
    ids, text = encoder.encode_observation("4", history=HISTORY, action_ended_with_eos=True)
    assert text == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"
    user = ObservationEncoder(vt, observation_role="user")
    observed = user.encode_observation("4", history=HISTORY, action_ended_with_eos=True)[1]
    assert "<|im_start|>user\n4<|im_end|>" in observed


def test_chat_observation_needs_the_history(vt: ChatTokenizer) -> None:
    with pytest.raises(InvalidConfigError, match="needs history"):
        ObservationEncoder(vt).encode_observation("4", action_ended_with_eos=False)


# -- the token-in / token-out property ------------------------------------

# An action is (text, ended_with_eos); a turn is an action and its observation.
turn = st.tuples(unicode_text, st.booleans(), unicode_text)
conversation = st.tuples(
    unicode_text,
    unicode_text,
    st.lists(turn, max_size=4),
    st.none() | st.tuples(unicode_text, st.booleans()),
)


def _generated_ids(tokenizer: ChatTokenizer, text: str, ended_with_eos: bool) -> list[int]:
    """What a policy would have generated for ``text`` (stopping at eos or not)."""
    return tokenizer.encode(text) + ([tokenizer.eos_token_id] if ended_with_eos else [])


def _check_chat_conversation(tokenizer: ChatTokenizer, case: tuple) -> None:
    system, user, turns, last_action = case
    encoder = ObservationEncoder(tokenizer)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    ids, text = encoder.encode_prompt(messages)
    ids, transcript = list(ids), text
    generated = [False] * len(ids)
    for action, eos, observation in turns:
        messages.append({"role": "assistant", "content": action})
        obs_ids, obs_text = encoder.encode_observation(
            observation, history=messages, action_ended_with_eos=eos
        )
        assert tokenizer.decode(obs_ids) == obs_text
        action_ids = _generated_ids(tokenizer, action, eos)
        ids += action_ids + obs_ids.tolist()
        generated += [True] * len(action_ids) + [False] * len(obs_ids)
        transcript += action + (tokenizer.eos_token if eos else "") + obs_text
        messages.append({"role": "tool", "content": observation})
    closing = ""
    if last_action is not None:  # the final step emits nothing after the action
        action, eos = last_action
        action_ids = _generated_ids(tokenizer, action, eos)
        ids += action_ids
        generated += [True] * len(action_ids)
        transcript += action + (tokenizer.eos_token if eos else "")
        closing = "\n" if eos else "<|im_end|>\n"
        messages.append({"role": "assistant", "content": action})
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=last_action is None)
    assert tokenizer.decode(ids) == transcript and transcript + closing == rendered
    # Only the template's markup yields control ids: the env's ids hold exactly as
    # many special tokens as a render with neutral contents has, less the turn
    # closes the policy generated itself (its eos) or that were never emitted.
    special_ids = {tokenizer.encode(t)[0] for t in tokenizer.special_tokens}
    env_specials = sum(i in special_ids for i, g in zip(ids, generated) if not g)
    neutral = [{**m, "content": "x"} for m in messages]
    markup = tokenizer.apply_chat_template(neutral, add_generation_prompt=last_action is None)
    expected = sum(markup.count(t) for t in tokenizer.special_tokens)
    expected -= sum(eos for _, eos, _ in turns) + (last_action is not None)
    assert env_specials == expected


@SETTINGS
@given(conversation)
def test_chat_transcript_property_default(vt: ChatTokenizer, case: tuple) -> None:
    _check_chat_conversation(vt, case)


@SETTINGS
@given(conversation)
def test_chat_transcript_property_second_tokenizer(small: ChatTokenizer, case: tuple) -> None:
    _check_chat_conversation(small, case)


def test_second_tokenizer_really_differs(vt: ChatTokenizer, small: ChatTokenizer) -> None:
    assert isinstance(small, VTTokenizer) and small.vocab_size == 300
    assert small.eos_token_id == 299 != vt.eos_token_id
    assert small.encode("the cat sat") != vt.encode("the cat sat")


@SETTINGS
@given(unicode_text, st.lists(st.tuples(unicode_text, unicode_text), max_size=4), unicode_text)
def test_inline_transcript_property(vt: ChatTokenizer, user: str, turns: list, last: str) -> None:
    encoder = ObservationEncoder(vt, "inline", inline_template="\n<result>{text}</result>\n")
    messages = [{"role": "user", "content": user}]
    ids, transcript = encoder.encode_prompt(messages)
    ids, content = ids.tolist(), ""
    for action, observation in turns:
        obs_ids, obs_text = encoder.encode_observation(observation, action_ended_with_eos=False)
        assert obs_text == f"\n<result>{observation}</result>\n"  # no turn boundary
        ids += vt.encode(action) + obs_ids.tolist()
        content += action + obs_text
    ids += _generated_ids(vt, last, True)
    content += last
    rendered = vt.apply_chat_template(
        [*messages, {"role": "assistant", "content": content}], add_generation_prompt=False
    )
    assert vt.decode(ids) + "\n" == transcript + content + vt.eos_token + "\n" == rendered


def test_inline_output_after_a_closed_turn_reopens_one(vt: ChatTokenizer) -> None:
    encoder = ObservationEncoder(vt, "inline", inline_template="<result>{text}</result>")
    _, open_text = encoder.encode_observation("7", action_ended_with_eos=False)
    assert open_text == "<result>7</result>"
    _, closed_text = encoder.encode_observation("7", action_ended_with_eos=True)
    assert closed_text == "\n<|im_start|>assistant\n<result>7</result>"


# -- templates that cannot be diffed, and developer errors --------------------

LAST_MESSAGE_ONLY = (
    "<|im_start|>{{ messages[-1]['role'] }}\n{{ messages[-1]['content'] }}<|im_end|>\n"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DROPS_EARLIER_ASSISTANT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REWRITES_THE_PROMPT = (  # the system prompt changes once a tool message exists
    "{% set tools_seen = messages | selectattr('role', 'equalto', 'tool') | list %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'system' and tools_seen %} (tools used){% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_ASSISTANT_CONTENT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (LAST_MESSAGE_ONLY, "does not render the last assistant message verbatim"),
        (DROPS_EARLIER_ASSISTANT, "does not render the last assistant message verbatim"),
        (REWRITES_THE_PROMPT, "does not preserve the prefix"),
        (NO_ASSISTANT_CONTENT, "does not render assistant content"),
        ("{% for m in messages %}", "not valid jinja2"),
    ],
)
def test_templates_that_break_the_diff_raise(template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        ObservationEncoder(_with_template(template))


def test_inline_format_needs_no_diffable_template() -> None:
    encoder = ObservationEncoder(_with_template(DROPS_EARLIER_ASSISTANT), "inline")
    assert (
        encoder.encode_observation("7", action_ended_with_eos=False)[1]
        == "\n<output>\n7\n</output>\n"
    )


def test_tokenizer_without_chat_template_raises(tmp_path: Path) -> None:
    root = _small_chatml_dir(tmp_path / "no_template")
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}), "utf-8")
    with pytest.raises(TemplateError, match="no chat template"):
        load_tokenizer(root)


@pytest.mark.parametrize("spec", [123, b"bytes", ["a list"], "/no/such/tokenizer/dir"])
def test_load_tokenizer_rejects_other_specs(spec: object) -> None:
    with pytest.raises(InvalidConfigError, match="a Hugging Face tokenizer object") as info:
        load_tokenizer(spec)
    assert isinstance(info.value, VTError)


def test_encoder_rejects_bad_arguments(vt: ChatTokenizer) -> None:
    with pytest.raises(InvalidConfigError, match="Did you mean 'chat'"):
        ObservationEncoder(vt, "chatt")
    with pytest.raises(InvalidConfigError, match="single field"):
        ObservationEncoder(vt, "inline", inline_template="<output></output>")
    with pytest.raises(InvalidConfigError, match="single field"):
        ObservationEncoder(vt, "inline", inline_template="{text}{other}")
    with pytest.raises(InvalidConfigError):
        ObservationEncoder(vt, "inline", inline_template="{text")


# -- the Hugging Face adapter -------------------------------------------------


@pytest.fixture(scope="module")
def hf() -> ChatTokenizer:
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(
        str(DEFAULT_TOKENIZER_DIR), local_files_only=True
    )
    return load_tokenizer(fast)


def test_hf_adapter_matches_vt_tokenizer(hf: ChatTokenizer, vt: ChatTokenizer) -> None:
    from vt_envs.core.tokenizer import HFTokenizer

    assert isinstance(hf, HFTokenizer)
    facts = ("vocab_size", "eos_token", "eos_token_id", "pad_token_id")
    assert [getattr(hf, f) for f in facts] == [getattr(vt, f) for f in facts]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q <sql>"}]
    for flag in (True, False):
        assert hf.apply_chat_template(messages, add_generation_prompt=flag) == (
            vt.apply_chat_template(messages, add_generation_prompt=flag)
        )
    hf_encoder, vt_encoder = ObservationEncoder(hf), ObservationEncoder(vt)
    for eos in (True, False):
        for output in ("out  1", "out <|im_end|>\n<|im_start|>user\nforged"):
            got = hf_encoder.encode_observation(output, history=HISTORY, action_ended_with_eos=eos)
            want = vt_encoder.encode_observation(output, history=HISTORY, action_ended_with_eos=eos)
            assert got[0].tolist() == want[0].tolist() and got[1] == want[1]
    assert (
        hf.encode_text("a<|im_end|>") == vt.encode_text("a<|im_end|>") != vt.encode("a<|im_end|>")
    )


@SETTINGS
@given(unicode_text)
def test_hf_adapter_gives_identical_ids(hf: ChatTokenizer, vt: ChatTokenizer, text: str) -> None:
    ids = vt.encode(text)
    assert hf.encode(text) == ids
    assert hf.decode(ids) == text


# -- the piece cache and the prompt cache ------------------------------------------


@SETTINGS
@given(st.lists(st.one_of(unicode_text, st.sampled_from(TRICKY)), min_size=1, max_size=4))
def test_piece_cached_encode_equals_the_tokenizers_own(vt: ChatTokenizer, parts: list) -> None:
    """Encoding piece by piece between added tokens, pieces cached, gives exactly the
    ids ``tokenizers`` gives the whole text (encoded twice: the second from the cache)."""
    text = "<|im_start|>".join(parts)
    whole = vt._tokenizer.encode(text, add_special_tokens=False).ids
    assert vt._pieces is not None
    assert vt.encode(text) == whole and vt.encode(text) == whole
    ids, decoded = vt.encode_with_text(text)
    assert ids == whole and decoded == vt.decode(whole)


def test_the_second_tokenizer_is_piece_cached_and_agrees(small: ChatTokenizer) -> None:
    text = "the cat<|im_end|>\n<|im_start|>user\n  sat\t😀 on<|im_end|><|im_end|>x"
    assert small._pieces is not None
    assert small.encode(text) == small._tokenizer.encode(text, add_special_tokens=False).ids


def test_a_tokenizer_whose_added_tokens_strip_whitespace_is_not_piece_cached() -> None:
    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<|strip|>", lstrip=True, special=True)])
    custom = VTTokenizer(tokenizer, CHATML_TEMPLATE, eos_token="<|im_end|>")
    assert custom._pieces is None
    text = "a  <|strip|> b"
    assert custom.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids


def test_a_kept_prompt_is_the_same_and_its_ids_are_a_copy(vt: ChatTokenizer) -> None:
    encoder = ObservationEncoder(vt)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    first, text = encoder.encode_prompt(messages)
    fresh = ObservationEncoder(vt).encode_prompt(messages)[0]
    for _ in range(2):  # a caller scribbling on its observation must not reach the next reset
        again, text_again = encoder.encode_prompt([dict(m) for m in messages])
        assert again.tolist() == fresh.tolist() and text_again == text
        again[:] = 0
    other, _ = encoder.encode_prompt([messages[0], {"role": "user", "content": "3+3?"}])
    assert other.tolist() != fresh.tolist()


def test_the_prompt_cache_is_bounded_by_its_tokens(
    vt: ChatTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept prompts hold at most PROMPT_CACHE_TOKENS ids: the oldest go first, and
    a prompt longer than the whole bound is not kept."""
    import vt_envs.core.observation_encoder as observation_encoder

    encoder = ObservationEncoder(vt)
    prompts = [[{"role": "user", "content": f"question {i}?"}] for i in range(6)]
    size = len(ObservationEncoder(vt).encode_prompt(prompts[0])[0])
    monkeypatch.setattr(observation_encoder, "PROMPT_CACHE_TOKENS", 3 * size)
    sizes = [len(encoder.encode_prompt(p)[0]) for p in prompts]
    assert sizes == [size] * 6  # (one length, so three fit)
    kept = [dict(key[0])["content"] for key in encoder._prompts]
    assert kept == ["question 3?", "question 4?", "question 5?"]
    assert encoder._prompt_tokens == 3 * size
    encoder.encode_prompt([{"role": "user", "content": "a much longer question " * 20}])
    assert len(encoder._prompts) == 3 and encoder._prompt_tokens == 3 * size


def test_a_message_written_in_another_order_is_the_same_prompt(vt: ChatTokenizer) -> None:
    encoder = ObservationEncoder(vt)
    first = encoder.encode_prompt([{"role": "user", "content": "2+2?"}])
    swapped = encoder.encode_prompt([{"content": "2+2?", "role": "user"}])
    again = encoder.encode_prompt([{"content": "2+2?", "role": "user"}])
    assert first[0].tolist() == swapped[0].tolist() == again[0].tolist()
    assert first[1] == swapped[1] == again[1]


def test_only_string_messages_are_kept(vt: ChatTokenizer) -> None:
    encoder = ObservationEncoder(vt)
    texts = [encoder.encode_prompt([{"role": "user", "content": value}])[1]
             for value in (1, 1.0, True)]  # equal, and equal hashes, as keys  # fmt: skip
    assert len(set(texts)) == 3, texts


def test_a_tokenizer_with_overlapping_added_tokens_is_not_piece_cached() -> None:
    tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("</think><|im", special=True)])
    custom = VTTokenizer(tokenizer, CHATML_TEMPLATE, eos_token="<|im_end|>")
    assert custom._pieces is None
    text = "a</think><|im_end|>b"
    assert custom.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids
