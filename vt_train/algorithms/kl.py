"""KL estimators between the policy and a reference policy, per token.

Each entry of :data:`KL_ESTIMATORS` maps ``(logprobs, ref_logprobs)`` (any
equal shapes; the log-probabilities of the *sampled* tokens under the policy
and the reference) to a same-shaped tensor whose expectation over tokens
sampled from the policy estimates ``KL(pi || pi_ref)`` (Schulman, "Approximating
KL Divergence", 2020). With ``log_r = logprobs - ref_logprobs``:

- ``k1 = log_r``: unbiased, high variance, can be negative.
- ``k2 = 0.5 * log_r**2``: biased, low variance, always >= 0.
- ``k3 = exp(-log_r) + log_r - 1``: unbiased, low variance, always >= 0
  (GRPO's choice).

Used as a *loss* term (``kl_in_reward=False``) their gradients differ, on
policy and in expectation: k1's gradient is 0, k2's is the gradient of
``KL(pi || pi_ref)``, k3's is the gradient of ``KL(pi_ref || pi)``. Used as a
*reward* penalty (``kl_in_reward=True``; no gradient flows) k1 is the
classic RLHF choice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vt_train.registry import Registry

if TYPE_CHECKING:
    from vt_train.algorithms.config import AlgorithmConfig

__all__ = ["KL_ESTIMATORS", "k1", "k2", "k3", "kl_penalty", "kl_token_rewards"]

KLEstimator = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")

# exp() of a log-ratio beyond this overflows float16/bfloat16 ranges and is
# meaningless anyway; clamping only changes tokens the policy already
# considers (near-)impossible under one of the two models.
_MAX_LOG_RATIO = 20.0
#: The largest per-token k3 value (verl clamps its low-variance KL at 10 too).
MAX_K3 = 10.0


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``log pi - log pi_ref``."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``0.5 * (log pi - log pi_ref) ** 2``."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``pi_ref / pi - log(pi_ref / pi) - 1``: >= 0, and 0 exactly where the
    two logprobs are equal; clamped at :data:`MAX_K3` (as verl's
    ``low_var_kl``), since one token the policy has made near-impossible under
    the reference would otherwise dominate the whole batch's penalty."""
    log_ratio = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return (torch.expm1(log_ratio) - log_ratio).clamp(max=MAX_K3)


def kl_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, config: AlgorithmConfig
) -> Tensor:
    """``[B, L]`` per-token KL estimate (``config.kl_estimator``), exactly 0
    where ``mask`` is 0 (whatever the logprobs hold there). Differentiable in
    ``logprobs``: aggregate it like a policy loss and add ``kl_coef`` times it
    when ``kl_in_reward`` is False."""
    estimator = KL_ESTIMATORS.get(config.kl_estimator)
    m = mask > 0
    # Sanitize before the estimator: garbage (even -inf) at masked positions
    # must not leak NaN into the gradient through 0 * inf.
    logprobs = torch.where(m, logprobs, 0.0)
    ref_logprobs = torch.where(m, ref_logprobs, 0.0)
    return torch.where(m, estimator(logprobs, ref_logprobs), 0.0)


@torch.no_grad()
def kl_token_rewards(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, config: AlgorithmConfig
) -> Tensor:
    """``-kl_coef * kl`` per generated token, for ``token_rewards`` of the
    token-level advantage estimators when ``kl_in_reward`` is True."""
    return -config.kl_coef * kl_penalty(logprobs, ref_logprobs, mask, config)
