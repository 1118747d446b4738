"""The tiny Qwen2 policy: vocabulary, save/load, logprob alignment, critic shape."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from train_helpers import SMALL_MODEL  # noqa: E402

import vt_envs  # noqa: E402
from vt_envs.errors import InvalidConfigError  # noqa: E402
from vt_train.model import (  # noqa: E402
    CriticModel,
    TinyModelConfig,
    build_tiny_model,
    save_pretrained_with_tokenizer,
    token_logprobs,
)

SMALL = TinyModelConfig(**SMALL_MODEL)


def test_model_uses_the_tokenizers_vocab_and_special_ids():
    tok = vt_envs.load_tokenizer()
    model = build_tiny_model(SMALL, tok)
    assert model.config.vocab_size == tok.vocab_size == 2048
    assert model.get_input_embeddings().weight.shape == (2048, 32)
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(SMALL)
    assert torch.equal(torch.rand(1), expected)  # building did not consume the global RNG
    b = build_tiny_model(SMALL)
    c = build_tiny_model(TinyModelConfig(**{**SMALL.__dict__, "seed": 1}))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    up_a, up_c = a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(up_a, up_c)


def test_invalid_shapes_are_rejected_with_the_fix():
    with pytest.raises(InvalidConfigError, match="must divide hidden_size"):
        TinyModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(InvalidConfigError, match="num_kv_heads"):
        TinyModelConfig(num_heads=4, num_kv_heads=3)


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    model = build_tiny_model(SMALL)
    path = save_pretrained_with_tokenizer(model, None, tmp_path / "policy")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([vt_envs.load_tokenizer().encode("<lookup>914</lookup> hello")])
    assert hf_tok.encode("<lookup>914</lookup> hello", add_special_tokens=False) == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_token_logprobs_alignment_by_hand():
    model = build_tiny_model(SMALL)
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    out = token_logprobs(model, ids, temperature=0.7)
    assert out.shape == (1, 5)
    assert out[0, 0] == 0.0
    with torch.no_grad():
        logits = model(ids).logits[0] / 0.7
    for t in range(1, 5):
        expected = torch.log_softmax(logits[t - 1], -1)[ids[0, t]]
        assert out[0, t].item() == pytest.approx(expected.item(), abs=1e-5)


def test_token_logprobs_masks_padding_and_restricted_positions_agree():
    model = build_tiny_model(SMALL)
    ids = torch.tensor([[5, 17, 300, 42, 9], [7, 8, 9, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    only = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    full = token_logprobs(model, ids, attn)
    part = token_logprobs(model, ids, attn, only=only)
    assert torch.all(full[1, 3:] == 0)
    assert torch.allclose(part, full * only, atol=1e-6)
    assert torch.all(part[only == 0] == 0)


def test_critic_values_are_per_token_and_start_at_zero():
    policy = build_tiny_model(SMALL)
    critic = CriticModel.from_policy(policy)
    ids = torch.tensor([[5, 17, 300, 42, 9], [7, 8, 9, 0, 0]])
    values = critic(ids, torch.ones_like(ids))
    assert values.shape == (2, 5)
    assert torch.all(values == 0)  # zero-initialised head
    assert torch.equal(critic.trunk.embed_tokens.weight, policy.model.embed_tokens.weight)
    critic.value_head.summary.bias.data.fill_(0.5)
    assert torch.allclose(critic(ids), torch.full((2, 5), 0.5))
