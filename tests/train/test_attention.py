"""``vt_sdpa``: grouped-query attention without K/V copies on the CPU computes what
transformers' SDPA path does (forward and gradients), with left padding and with a
KV cache, and is what the HF engine and ``load_policy`` models run."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.train.test_engines import TOK, tiny_qwen2
from vt_train.attention import ATTENTION_NAME, use_cpu_gqa_attention
from vt_train.engines import HFEngine


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, TOK.vocab_size, (3, 24), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padding, as a rollout batch has
    mask[2, :15] = 0
    return ids, mask


def test_grouped_attention_matches_sdpa_forward_and_backward():
    reference = tiny_qwen2(seed=3)
    ours = use_cpu_gqa_attention(copy.deepcopy(reference))
    assert reference.config._attn_implementation == "sdpa"
    assert ours.config._attn_implementation == ATTENTION_NAME
    ids, mask = _padded_batch()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    outputs = []
    for model in (reference, ours):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        logits[real].logsumexp(-1).sum().backward()
        outputs.append((logits[real], [p.grad for p in model.parameters()]))
    (a, grads_a), (b, grads_b) = outputs
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-5)


def test_decode_with_a_cache_matches_sdpa():
    reference = tiny_qwen2(seed=4)
    ours = use_cpu_gqa_attention(copy.deepcopy(reference))
    ids, mask = _padded_batch()
    steps = []
    for model in (reference, ours):
        with torch.no_grad():
            out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
            step = model(
                input_ids=ids[:, -1:], attention_mask=mask, past_key_values=out.past_key_values
            )
        steps.append(step.logits)
    torch.testing.assert_close(steps[0], steps[1], rtol=0, atol=1e-5)


def test_the_hf_engine_switches_a_text_model_and_leaves_eager_alone():
    model = tiny_qwen2(seed=5)
    HFEngine(model, TOK)
    assert model.config._attn_implementation == ATTENTION_NAME
    eager = tiny_qwen2(seed=5)
    eager.set_attn_implementation("eager")
    HFEngine(eager, TOK)
    assert eager.config._attn_implementation == "eager"


def test_no_key_value_copies_with_a_mask(monkeypatch):
    """The point of ``vt_sdpa``: transformers' path repeats K/V heads when there is a
    mask; ours never calls ``repeat_kv``."""
    import transformers.integrations.sdpa_attention as sdpa

    def copies(*args, **kwargs):
        raise AssertionError("repeat_kv called: K/V heads were copied")

    monkeypatch.setattr(sdpa, "repeat_kv", copies)
    ids, mask = _padded_batch()
    ours = use_cpu_gqa_attention(tiny_qwen2(seed=6))
    with torch.no_grad():
        ours(input_ids=ids, attention_mask=mask)
    reference = tiny_qwen2(seed=6)
    with torch.no_grad(), pytest.raises(AssertionError, match="repeat_kv"):
        reference(input_ids=ids, attention_mask=mask)
