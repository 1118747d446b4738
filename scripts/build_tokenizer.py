"""Build the default offline tokenizer shipped in ``vt_envs/assets/tokenizer``.

Usage (from the repository root)::

    python scripts/build_tokenizer.py [--out DIR] [--docs N] [--seed S]

Trains a byte-level BPE with the ``tokenizers`` library on the corpus that
``scripts/tokenizer_corpus.py`` generates (no outside text), then writes the Hugging
Face layout (``tokenizer.json``, ``tokenizer_config.json`` with the ChatML
chat template, ``special_tokens_map.json``), which both ``VTTokenizer`` and
``transformers.AutoTokenizer.from_pretrained`` load. The same arguments give
byte-identical files.

Design choices, and why:
- 2048 ids in all (BPE + 3 special + 20 tag tokens + the ``<image>``
  placeholder): a power of two for the embedding table, small enough for
  tiny models.
- Digits are split one per pre-token, so no merge ever contains a digit:
  a small model copies numbers digit by digit.
- No normalizer, no prefix space, no stripping: ``decode(encode(s)) == s``.
- The tool tags are added (non-special) tokens, so each is one id.
- ``<image>`` is a special token: the env puts it where an image goes; text
  the policy did not write never yields it. It takes the id of the last BPE
  merge (which is dropped), so every other id is what it was before it was
  added and models built on the earlier vocabulary are unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "scripts"))  # tokenizer_corpus, also when imported

from tokenizer_corpus import generate_corpus  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from vt_envs.core.tokenizer import (  # noqa: E402
    CHATML_TEMPLATE,
    DEFAULT_TOKENIZER_DIR,
    IMAGE_TOKEN,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    VTTokenizer,
)

VOCAB_SIZE = 2048
EOS, PAD = "<|im_end|>", "<|endoftext|>"
# GPT-4 style word splitting, except that numbers are split into single
# digits (\p{N} without +). Contractions, letters with one leading
# non-letter, punctuation runs, newlines and whitespace runs stay together.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SAMPLES = [
    "The flight costs 1234.50 dollars.",
    "<python>\nprint(2 ** 10)\n</python>",
    '<tool_call>{"name": "sql", "arguments": {"query": "SELECT * FROM flights"}}</tool_call>',
    "<|im_start|>assistant\n<answer>42</answer><|im_end|>",
]


def build(n_docs: int, seed: int) -> Tokenizer:
    """Train the tokenizer (deterministic for fixed ``n_docs`` and ``seed``)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TAG_TOKENS),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_corpus(n_docs, seed=seed), trainer, length=n_docs)
    tokenizer = _drop_last_merge(tokenizer)
    tokenizer.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False, single_word=False) for t in TAG_TOKENS]
    )
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != VOCAB_SIZE:
        raise SystemExit(f"expected {VOCAB_SIZE} ids, trained {size}: grow the corpus (--docs)")
    return tokenizer


def _drop_last_merge(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer without its last BPE merge and that merge's token (the highest id)."""
    data = json.loads(tokenizer.to_str())
    model = data["model"]
    vocab = model["vocab"]
    last = max(vocab, key=vocab.get)
    merge = model["merges"].pop()
    if "".join(merge) != last:
        raise SystemExit(f"the last merge {merge} does not make the last token {last!r}")
    del vocab[last]
    return Tokenizer.from_str(json.dumps(data))


def write(tokenizer: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHATML_TEMPLATE,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", IMAGE_TOKEN],
    }
    special = {
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", IMAGE_TOKEN],
    }
    for name, data in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        (out / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_TOKENIZER_DIR)
    parser.add_argument("--docs", type=int, default=20_000, help="corpus size in documents")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    write(build(args.docs, args.seed), args.out)
    loaded = VTTokenizer.from_dir(args.out)
    print(f"wrote {args.out} (vocab_size={loaded.vocab_size})")
    for text in SAMPLES:
        ids = loaded.encode(text)
        pieces = [loaded.decode([i]) for i in ids]
        print(f"{len(ids):3d} tokens  {text!r}\n           {pieces}")


if __name__ == "__main__":
    main()
