"""KL estimators: known values, k3 >= 0, unbiasedness, and their loss gradients."""

from __future__ import annotations

import math

import pytest
import torch

from vt_envs.errors import UnknownNameError
from vt_train.algorithms import KL_ESTIMATORS, AlgorithmConfig, kl_penalty, kl_token_rewards

LOGP = torch.tensor([-1.0, -2.0, -0.3])
REF = torch.tensor([-1.5, -1.0, -0.3])


def test_k1_k2_k3_known_values() -> None:
    torch.testing.assert_close(KL_ESTIMATORS.get("k1")(LOGP, REF), torch.tensor([0.5, -1.0, 0.0]))
    torch.testing.assert_close(KL_ESTIMATORS.get("k2")(LOGP, REF), torch.tensor([0.125, 0.5, 0.0]))
    # k3 with x = ref - logp: exp(x) - x - 1
    want = [math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0]
    torch.testing.assert_close(KL_ESTIMATORS.get("k3")(LOGP, REF), torch.tensor(want))


def test_k3_is_nonnegative_and_zero_at_equality() -> None:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(10_000, generator=g) * 30
    ref = -torch.rand(10_000, generator=g) * 30
    assert (KL_ESTIMATORS.get("k3")(logp, ref) >= 0).all()
    assert torch.equal(KL_ESTIMATORS.get("k3")(logp, logp), torch.zeros(10_000))


def test_k3_is_clamped_so_one_far_token_cannot_blow_up_the_loss() -> None:
    from vt_train.algorithms.kl import MAX_K3

    logp = torch.tensor([-0.1, -30.0], requires_grad=True)
    ref = torch.tensor([-30.0, -0.1])  # exp(29.9) - 29.9 - 1 would be ~1e13
    k3 = KL_ESTIMATORS.get("k3")(logp, ref)
    assert k3[1] == MAX_K3 and torch.isfinite(k3).all()
    k3.sum().backward()
    assert logp.grad[1] == 0.0 and torch.isfinite(logp.grad).all()


def two_policies() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, generator=g, dtype=torch.float64), torch.randn(
        6, generator=g, dtype=torch.float64
    )


def test_k1_and_k3_are_unbiased_estimates_of_kl() -> None:
    logits, ref_logits = two_policies()
    logp, ref = logits.log_softmax(-1), ref_logits.log_softmax(-1)
    true_kl = float((logp.exp() * (logp - ref)).sum())
    samples = torch.multinomial(
        logp.exp(), 400_000, replacement=True, generator=torch.Generator().manual_seed(2)
    )
    for name in ("k1", "k3"):
        est = float(KL_ESTIMATORS.get(name)(logp[samples], ref[samples]).mean())
        assert est == pytest.approx(true_kl, rel=0.02), name


@pytest.mark.parametrize("name, direction", [("k1", None), ("k2", "reverse"), ("k3", "forward")])
def test_expected_gradient_of_each_estimator_as_a_loss(name: str, direction: str | None) -> None:
    """E_{y~pi}[grad k(y)] computed exactly (sum over the vocabulary with pi
    held fixed): k1 -> 0, k2 -> grad KL(pi||ref), k3 -> grad KL(ref||pi)."""
    logits, ref_logits = two_policies()
    logits.requires_grad_(True)
    ref = ref_logits.log_softmax(-1)
    logp = logits.log_softmax(-1)
    expected = (logp.exp().detach() * KL_ESTIMATORS.get(name)(logp, ref)).sum()
    (grad,) = torch.autograd.grad(expected, logits)
    if direction is None:
        torch.testing.assert_close(grad, torch.zeros_like(grad))
        return
    p = logits.log_softmax(-1)
    kl = (p.exp() * (p - ref)).sum() if direction == "reverse" else (ref.exp() * (ref - p)).sum()
    (want,) = torch.autograd.grad(kl, logits)
    torch.testing.assert_close(grad, want)


def test_kl_penalty_is_zero_and_gradient_free_off_mask() -> None:
    cfg = AlgorithmConfig(kl_estimator="k3")
    logp = torch.tensor([[float("-inf"), -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.5, float("nan")]])
    mask = torch.tensor([[0, 1, 0]])
    kl = kl_penalty(logp, ref, mask, cfg)
    torch.testing.assert_close(kl, torch.tensor([[0.0, math.exp(-0.5) + 0.5 - 1, 0.0]]))
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0 and logp.grad[0, 1] != 0


def test_kl_token_rewards_are_the_negative_weighted_penalty() -> None:
    cfg = AlgorithmConfig(
        advantage="reinforce_pp", kl_estimator="k1", kl_coef=0.1, kl_in_reward=True
    )
    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    rewards = kl_token_rewards(
        logp, torch.tensor([[0.0, -1.5, -1.0]]), torch.tensor([[0, 1, 1]]), cfg
    )
    torch.testing.assert_close(rewards, torch.tensor([[0.0, -0.05, 0.1]]))
    assert not rewards.requires_grad


def test_unknown_estimator_lists_the_valid_ones() -> None:
    with pytest.raises(
        UnknownNameError, match=r"Did you mean 'k3'.*Known KL estimators: k1, k2, k3"
    ):
        AlgorithmConfig(kl_estimator="kl3")
