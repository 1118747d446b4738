"""Policy losses, value loss and aggregation against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vt_envs.errors import InvalidConfigError
from vt_train.algorithms import (
    ADVANTAGES,
    POLICY_LOSSES,
    AlgorithmConfig,
    aggregate,
    kl_penalty,
    loss_normalizers,
    value_loss,
)


def ppo_token(adv: float, ratio: float, **cfg: object) -> tuple[float, float, dict]:
    """Loss and d loss / d logprob of one generated token (index 1; index 0
    is a masked prompt token holding -inf, as index 0 may)."""
    logp = torch.tensor([[float("-inf"), -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.0 - math.log(ratio)]])
    advantages = torch.tensor([[0.0, adv]])
    mask = torch.tensor([[0, 1]])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(
        logp, old, advantages, mask, AlgorithmConfig(**cfg)
    )
    loss.sum().backward()
    assert loss[0, 0] == 0 and logp.grad[0, 0] == 0
    return float(loss[0, 1].detach()), float(logp.grad[0, 1]), metrics


@pytest.mark.parametrize(
    "adv, ratio, cfg, want_loss, want_grad, clipped",
    [
        # A > 0, ratio above 1 + eps: clipped at 1.2, no gradient.
        (1.0, 1.5, {}, -1.2, 0.0, True),
        # A < 0, ratio below 1 - eps: clipped at 0.8, no gradient.
        (-1.0, 0.5, {}, 0.8, 0.0, True),
        # The pessimistic side is never clipped: gradient -A * ratio.
        (1.0, 0.5, {}, -0.5, -0.5, False),
        (-1.0, 1.5, {}, 1.5, 1.5, False),
        (2.0, 1.1, {}, -2.2, -2.2, False),
        # Clip-higher: 1.25 is inside 1 + 0.28.
        (1.0, 1.25, {"clip_high": 0.28}, -1.25, -1.25, False),
        (1.0, 1.25, {"clip_high": 0.2}, -1.2, 0.0, True),
        # A < 0 and a huge ratio: unbounded without dual clip ...
        (-1.0, 5.0, {}, 5.0, 5.0, False),
        # ... capped at -c * A = 3 with dual clip 3, with zero gradient.
        (-1.0, 5.0, {"dual_clip": 3.0}, 3.0, 0.0, False),
        # Dual clip only caps losses above -c * A.
        (-1.0, 2.0, {"dual_clip": 3.0}, 2.0, 2.0, False),
    ],
)
def test_ppo_clip_cases(adv, ratio, cfg, want_loss, want_grad, clipped) -> None:
    loss, grad, metrics = ppo_token(adv, ratio, **cfg)
    assert loss == pytest.approx(want_loss, abs=1e-6)
    assert grad == pytest.approx(want_grad, abs=1e-6)
    if want_grad == 0.0:
        assert grad == 0.0  # exactly, not approximately
    assert float(metrics["policy/clip_frac"]) == float(clipped)
    assert float(metrics["policy/ratio_mean"]) == pytest.approx(ratio, rel=1e-6)
    approx_kl = ratio - 1 - math.log(ratio)  # k3 of KL(old || new) on old samples
    assert float(metrics["policy/approx_kl"]) == pytest.approx(approx_kl, abs=1e-6)


def test_ppo_dual_clip_metric() -> None:
    _, _, metrics = ppo_token(-1.0, 5.0, dual_clip=3.0)
    assert float(metrics["policy/dual_clip_frac"]) == 1.0


def test_ppo_clip_fraction_is_over_generated_tokens() -> None:
    logp = torch.zeros(1, 5)
    old = -torch.log(torch.tensor([[9.0, 1.5, 1.0, 1.0, 1.0]]))  # index 0 (masked) "clipped"
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(
        logp, old, torch.ones(1, 5), torch.tensor([[0, 1, 1, 1, 1]]), AlgorithmConfig()
    )
    assert float(metrics["policy/clip_frac"]) == 0.25
    assert loss[0, 0] == 0


# ------------------------------------------------------------------ GSPO


def test_gspo_on_policy_ratio_is_one_and_loss_is_minus_advantage() -> None:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 1], [0, 1, 0, 0, 0]])
    adv = torch.tensor([0.5, -1.0, 2.0])[:, None] * mask
    loss, metrics = POLICY_LOSSES.get("gspo")(logp, logp.clone(), adv, mask, AlgorithmConfig())
    torch.testing.assert_close(loss, -adv)
    assert float(metrics["policy/ratio_mean"]) == 1.0
    assert float(metrics["policy/seq_ratio_mean"]) == 1.0
    assert float(metrics["policy/clip_frac"]) == 0.0


def test_gspo_gradient_is_the_sequence_level_gradient() -> None:
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(4, 6, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.02 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) > 0.3).long()
    mask[:, 0] = 0
    mask[0, 1] = 1
    seq_adv = torch.tensor([1.0, -0.5, 0.3, -2.0], dtype=torch.float64)
    cfg = AlgorithmConfig(policy_loss="gspo", clip_low=0.2, clip_high=0.2)
    loss_mat, _ = POLICY_LOSSES.get("gspo")(logp, old, seq_adv[:, None] * mask, mask, cfg)
    loss = aggregate(loss_mat, mask, "seq-mean-token-mean", config=cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    # The paper's objective: mean_i -A_i * s_i, s_i = exp(mean_t log(pi / pi_old)).
    n = mask.sum(-1)
    s = torch.exp(((logp - old) * mask).sum(-1) / n)
    ref = (-seq_adv * s)[n > 0].mean()
    (want,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, want)


def test_gspo_survives_a_huge_sequence_log_ratio() -> None:
    logp = torch.tensor([[-0.1, -0.1]], requires_grad=True)
    old = torch.tensor([[-200.0, -200.0]])  # mean log-ratio 199.9: exp() would be inf
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = POLICY_LOSSES.get("gspo")(
        logp, old, torch.ones(1, 2), mask, AlgorithmConfig(policy_loss="gspo")
    )
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    assert torch.isfinite(metrics["policy/seq_ratio_mean"])


def test_gspo_clips_whole_sequences() -> None:
    # Sequence 0: token log-ratios 0 and log(2.25): mean log(1.5) -> clipped
    # as a whole (PPO would clip only the second token). Sequence 1: on policy.
    logp = torch.zeros(2, 3, requires_grad=True)
    old = torch.tensor([[0.0, 0.0, -math.log(2.25)], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    loss, metrics = POLICY_LOSSES.get("gspo")(
        logp, old, mask.float(), mask, AlgorithmConfig(policy_loss="gspo")
    )
    torch.testing.assert_close(loss[0], torch.tensor([0.0, -1.2, -1.2]))
    loss.sum().backward()
    assert torch.equal(logp.grad[0], torch.zeros(3))
    assert torch.equal(logp.grad[1], torch.tensor([0.0, -1.0, -1.0]))
    assert float(metrics["policy/clip_frac"]) == 0.5


# ------------------------------------------------------------------ value loss


@pytest.mark.parametrize(
    "value, value_clip, want_loss, want_grad",
    [
        (1.5, 0.2, 0.5 * (1.2 - 2.0) ** 2, 0.0),  # moved 0.5 > 0.2: clipped target wins
        (1.1, 0.2, 0.5 * (1.1 - 2.0) ** 2, 1.1 - 2.0),  # inside the clip range
        (1.5, None, 0.5 * (1.5 - 2.0) ** 2, 1.5 - 2.0),  # no clipping
        (3.0, 0.2, 0.5 * (3.0 - 2.0) ** 2, 3.0 - 2.0),  # clipped error (0.8) is smaller: unclipped
    ],
)
def test_value_loss_cases(value, value_clip, want_loss, want_grad) -> None:
    values = torch.tensor([[0.0, value]], requires_grad=True)
    cfg = AlgorithmConfig(advantage="gae", use_critic=True, value_clip=value_clip)
    loss, metrics = value_loss(
        values, torch.tensor([[5.0, 1.0]]), torch.tensor([[9.0, 2.0]]), torch.tensor([[0, 1]]), cfg
    )
    loss.sum().backward()
    loss = loss.detach()
    assert float(loss[0, 0]) == 0.0 and float(values.grad[0, 0]) == 0.0
    assert float(loss[0, 1]) == pytest.approx(want_loss, abs=1e-6)
    assert float(values.grad[0, 1]) == pytest.approx(want_grad, abs=1e-6)
    assert float(metrics["critic/vf_clip_frac"]) == float(want_grad == 0.0)


# ------------------------------------------------------------------ aggregation

LOSS = torch.tensor([[100.0, 1.0, 2.0, 3.0], [100.0, 4.0, 100.0, 100.0], [7.0, 7.0, 7.0, 7.0]])
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # row 2: nothing generated


@pytest.mark.parametrize(
    "mode, want",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", (6 / 10 + 4 / 10) / 2),
    ],
)
def test_aggregation_known_values(mode: str, want: float) -> None:
    cfg = AlgorithmConfig(loss_agg=mode, loss_norm_tokens=10)
    assert float(aggregate(LOSS, MASK, mode, config=cfg)) == pytest.approx(want)
    assert loss_normalizers(MASK) == {"num_tokens": 4.0, "num_seqs": 2.0}


def test_sum_norm_needs_the_constant() -> None:
    with pytest.raises(InvalidConfigError, match="loss_norm_tokens"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", config=None)


def accumulation_setup(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    b, length = 8, 7
    logp = (-torch.rand(b, length, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(b, length, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, length, generator=g) > 0.4).long()
    mask[:, 0] = 0
    mask[3] = 0  # a row without generated tokens
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64) * mask
    return logp, old, adv, mask


def _ppo_loss(logp, old, adv, mask, mode, cfg, **normalizers):
    loss_mat, _ = POLICY_LOSSES.get("ppo_clip")(logp, old, adv, mask, cfg)
    return aggregate(loss_mat, mask, mode, config=cfg, **normalizers)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_is_exact(mode: str) -> None:
    logp, old, adv, mask = accumulation_setup()
    cfg = AlgorithmConfig(loss_agg=mode, loss_norm_tokens=16)
    full = _ppo_loss(logp, old, adv, mask, mode, cfg)
    (grad_full,) = torch.autograd.grad(full, logp)

    global_norm = loss_normalizers(mask)
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(8).chunk(4):  # 4 micro-batches of 2 rows
        micro = _ppo_loss(logp[rows], old[rows], adv[rows], mask[rows], mode, cfg, **global_norm)
        micro.backward()  # gradients accumulate in logp.grad, as in training
        total += micro.detach()
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(logp.grad, grad_full)
    assert grad_full.abs().sum() > 0


def test_micro_batch_local_normalizers_would_be_wrong() -> None:
    # The negative control of the test above: local token counts give a different loss.
    logp, old, adv, mask = accumulation_setup()
    cfg = AlgorithmConfig(loss_agg="token-mean")
    full = _ppo_loss(logp, old, adv, mask, "token-mean", cfg)
    local = [
        _ppo_loss(logp[r], old[r], adv[r], mask[r], "token-mean", cfg)
        for r in torch.arange(8).chunk(4)
    ]
    assert abs(float(sum(local).detach() / 4) - float(full.detach())) > 1e-3


# ------------------------------------------------------------------ perturbation


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The trainer's convention: logprob of token t from logits at t - 1; index 0 padded."""
    lp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return F.pad(lp, (1, 0))


@pytest.mark.parametrize(
    "policy_loss, loss_agg",
    [
        ("ppo_clip", "token-mean"),
        ("ppo_clip", "seq-mean-token-mean"),
        ("gspo", "seq-mean-token-mean"),
        ("ppo_clip", "seq-mean-token-sum-norm"),
    ],
)
def test_perturbing_observation_logits_changes_neither_loss_nor_gradient(
    policy_loss: str, loss_agg: str
) -> None:
    g = torch.Generator().manual_seed(3)
    b, length, vocab = 4, 10, 13
    logits = torch.randn(b, length, vocab, generator=g)
    ids = torch.randint(vocab, (b, length), generator=g)
    mask = torch.tensor(
        [
            [0, 0, 1, 1, 0, 0, 1, 1, 1, 0],
            [0, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            [0, 0, 0, 1, 0, 1, 0, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        ]
    )
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    cfg = AlgorithmConfig(
        policy_loss=policy_loss,
        loss_agg=loss_agg,
        loss_norm_tokens=16,
        kl_coef=0.1,
        kl_estimator="k3",
        dual_clip=3.0 if policy_loss == "ppo_clip" else None,
    )
    adv, _ = ADVANTAGES.get("grpo")(rewards, mask, torch.zeros(b, dtype=torch.long), cfg)
    noise = 0.3 * torch.randn(b, length, generator=g)
    with torch.no_grad():
        old = token_logprobs(logits, ids) + noise
        ref = token_logprobs(logits, ids) - noise

    def loss_and_grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.clone().requires_grad_(True)
        logp = token_logprobs(x, ids)
        loss_mat, _ = POLICY_LOSSES.get(policy_loss)(logp, old, adv, mask, cfg)
        loss = aggregate(loss_mat, mask, loss_agg, config=cfg)
        loss = loss + cfg.kl_coef * aggregate(
            kl_penalty(logp, ref, mask, cfg), mask, loss_agg, config=cfg
        )
        (grad,) = torch.autograd.grad(loss, x)
        return loss.detach(), grad

    # Logits at position p predict token p + 1: perturb wherever token p + 1
    # is not generated, and the last position (which predicts nothing).
    unused = torch.ones(b, length, dtype=torch.bool)
    unused[:, :-1] = mask[:, 1:] == 0
    perturbed = logits + 50.0 * torch.randn(b, length, vocab, generator=g) * unused[..., None]
    loss, grad = loss_and_grad(logits)
    loss_p, grad_p = loss_and_grad(perturbed)
    assert torch.equal(loss_p, loss)
    assert torch.equal(grad_p, grad)
    assert torch.equal(grad[unused], torch.zeros_like(grad[unused]))
    assert (grad[~unused].abs().sum(-1) > 0).all()
