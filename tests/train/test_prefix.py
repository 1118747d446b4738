"""The shared-prefix forward is the plain forward, run cheaper.

A batch whose rows start alike (the system prompt) runs that prefix through
the decoder once; SFT losses, logprobs, entropies and every gradient must
equal the plain forward's, with padding, rows of different lengths and loss
positions that start at different places.
"""

from __future__ import annotations

import pytest
import torch

import vt_envs
from vt_train import prefix
from vt_train.logprobs import LogprobModel
from vt_train.model import TinyModelConfig, build_tiny_model
from vt_train.sft import sft_loss


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_tiny_model(TinyModelConfig(num_layers=2), vt_envs.load_tokenizer())


def _batch(shared: int = 80, rows: int = 6, length: int = 130):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 2000, (rows, length), generator=gen)
    ids[:, :shared] = ids[0, :shared]
    attention = torch.ones_like(ids)
    attention[2, 100:] = 0  # right padding, rows of different lengths
    attention[4, 95:] = 0
    loss_mask = torch.zeros(rows, length)
    for row in range(rows):  # responses start after the shared prompt, row by row
        loss_mask[row, shared + 3 + row :] = 1
    return ids, attention, loss_mask * attention


def _with_prefix(enabled: bool, monkeypatch) -> None:
    monkeypatch.setattr(prefix, "MIN_PREFIX", 32 if enabled else 10**9)


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _sft(model, batch, enabled, monkeypatch):
    _with_prefix(enabled, monkeypatch)
    model.zero_grad()
    loss = sft_loss(model, *batch)
    loss.backward()
    return loss.detach(), _grads(model)


def test_sft_loss_and_gradients_match_the_plain_forward(model, monkeypatch):
    batch = _batch()
    calls = []
    monkeypatch.setattr(prefix, "shared_prefix_length", _spy(prefix.shared_prefix_length, calls))
    plain_loss, plain_grads = _sft(model, batch, False, monkeypatch)
    fast_loss, fast_grads = _sft(model, batch, True, monkeypatch)
    assert calls[-1] == 80  # the fast path ran on the whole shared prompt
    ids, attention, loss_mask = batch
    with torch.no_grad():  # the definition: token-mean NLL of the loss tokens, full logits
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none"
        )
        reference = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
    torch.testing.assert_close(plain_loss, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast_loss, plain_loss, rtol=1e-5, atol=1e-6)
    _same_gradients(fast_grads, plain_grads)


def test_logprobs_entropy_and_gradients_match_the_plain_forward(model, monkeypatch):
    ids, attention, loss_mask = _batch()
    scorer = LogprobModel(model)
    results = []
    for enabled in (False, True):
        _with_prefix(enabled, monkeypatch)
        model.zero_grad()
        logprobs, entropy = scorer(ids, attention, positions=loss_mask, entropy=True)
        (logprobs.sum() + 0.1 * entropy.sum()).backward()
        results.append((logprobs.detach(), entropy.detach(), _grads(model)))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    with torch.no_grad():  # the definition: log p(token t | tokens < t) from full logits
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        reference = torch.zeros_like(lp0)
        reference[:, 1:] = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        reference *= loss_mask
    torch.testing.assert_close(lp0, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-5)
    _same_gradients(g1, g0)


def test_the_prefix_never_covers_a_scored_position(model, monkeypatch):
    """Scoring that starts inside the shared run keeps the prefix before it."""
    ids, attention, _ = _batch(shared=80)
    positions = torch.zeros_like(attention)
    positions[:, 50:] = attention[:, 50:]  # scored from token 50, inside the shared 80
    calls = []
    monkeypatch.setattr(prefix, "shared_prefix_length", _spy(prefix.shared_prefix_length, calls))
    scorer = LogprobModel(model)
    _with_prefix(True, monkeypatch)
    with torch.no_grad():
        fast, _ = scorer(ids, attention, positions=positions)
    _with_prefix(False, monkeypatch)
    with torch.no_grad():
        plain, _ = scorer(ids, attention, positions=positions)
    assert calls[0] == 49  # the hidden state at 49 scores token 50
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_no_shared_prefix_without_a_common_start_or_with_left_padding():
    ids = torch.arange(40).repeat(3, 1)
    assert prefix.shared_prefix_length(ids, None, first_needed=100) == 39  # one left after
    ids[1, 7] = 0
    assert prefix.shared_prefix_length(ids, None, first_needed=100) == 7
    mask = torch.ones_like(ids)
    mask[2, 0] = 0  # a left-padded row: nothing is shared
    assert prefix.shared_prefix_length(ids, mask, first_needed=100) == 0


def test_gradient_checkpointing_takes_the_plain_path(monkeypatch):
    model = build_tiny_model(TinyModelConfig(num_layers=1), vt_envs.load_tokenizer())
    model.gradient_checkpointing_enable()
    model.train()
    calls = []
    monkeypatch.setattr(prefix, "shared_prefix_length", _spy(prefix.shared_prefix_length, calls))
    loss = sft_loss(model, *_batch())
    loss.backward()
    assert calls == [] and torch.isfinite(loss)


def _same_gradients(fast_grads, plain_grads):
    """Equal up to float32 reassociation: within 1e-4 of each tensor's largest entry."""
    for fast, plain in zip(fast_grads, plain_grads, strict=True):
        scale = plain.abs().max().item()
        assert scale > 0
        assert (fast - plain).abs().max().item() <= 1e-4 * scale


def _spy(function, calls):
    def spied(*args, **kwargs):
        result = function(*args, **kwargs)
        calls.append(result)
        return result

    return spied


@pytest.mark.parametrize("rope", [{"rope_type": "dynamic", "factor": 2.0}, {"type": "longrope"}])
def test_length_dependent_rope_takes_the_plain_path(rope):
    from types import SimpleNamespace

    decoder = SimpleNamespace(config=SimpleNamespace(rope_scaling=rope), training=False)
    assert prefix._length_dependent_rope(decoder)
    assert not prefix._length_dependent_rope(
        SimpleNamespace(config=SimpleNamespace(rope_scaling={"rope_type": "linear"}))
    )
