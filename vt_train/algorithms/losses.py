"""Policy losses, the value loss, and how a ``[B, L]`` loss matrix becomes a scalar.

Policy losses (:data:`POLICY_LOSSES`) share one signature::

    loss_fn(logprobs, old_logprobs, advantages, mask, config) -> (loss_mat, metrics)

- ``logprobs``: ``[B, L]`` the current policy's ``log pi(token t | tokens < t)``
  (differentiable), token-aligned: index 0 and every position where ``mask``
  is 0 may hold anything (even ``-inf``): it is never read.
- ``old_logprobs``: ``[B, L]`` the behaviour policy's logprobs (no gradient).
- ``advantages``: ``[B, L]`` from :mod:`~vt_train.algorithms.advantages`.
- ``mask``: ``[B, L]`` 1 exactly on policy-generated tokens.
- ``loss_mat``: ``[B, L]`` per-token loss (to *minimize*), exactly 0 where
  ``mask`` is 0, with no gradient flowing to masked positions.
- ``metrics``: detached 0-dim tensors (no host sync here; the trainer calls
  ``.item()`` when it logs): ``policy/clip_frac`` (fraction of generated
  tokens whose gradient the clip removed), ``policy/approx_kl`` (estimate of
  ``KL(old || new)``, k3 on old samples), ``policy/ratio_mean``, and
  per-loss extras.

Aggregation (:data:`LOSS_AGG`, :func:`aggregate`) divides by *global*
normalizers: when a minibatch is split row-wise into micro-batches, pass the
minibatch's ``num_tokens`` / ``num_seqs`` (:func:`loss_normalizers`) to every
micro-batch, and the sum of the micro-batch losses (and of their gradients)
equals the minibatch loss exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vt_envs.errors import InvalidConfigError
from vt_train.algorithms.advantages import masked_mean
from vt_train.registry import Registry

if TYPE_CHECKING:
    from vt_train.algorithms.config import AlgorithmConfig

__all__ = [
    "LOSS_AGG",
    "POLICY_LOSSES",
    "aggregate",
    "gspo",
    "loss_normalizers",
    "ppo_clip",
    "value_loss",
]

PolicyLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")

# Log-ratios beyond this are clamped before exp(): such a token is already
# far outside any clip range, so its gradient is zero either way; the clamp
# only keeps exp() finite.
_MAX_LOG_RATIO = 20.0
_MAX_SEQ_LOG_RATIO = 10.0


def _sanitize(mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Zero every tensor where ``mask`` is 0, so garbage there (``-inf``
    logprobs at index 0, perturbed observation logits) never reaches the loss
    or, through ``0 * inf``, the gradient."""
    m = mask > 0
    return tuple(torch.where(m, t, 0.0) for t in tensors)


def _clipped_objective(
    ratio: Tensor, advantages: Tensor, config: AlgorithmConfig
) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic clipped loss per token and where the clip was active."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: AlgorithmConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip (Schulman et al. 2017) with clip-higher and dual clip.

    With ``ratio = exp(logprobs - old_logprobs)``, per token::

        loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))

    ``clip_high > clip_low`` is DAPO's clip-higher (more room to raise
    unlikely tokens). With ``config.dual_clip = c`` (Ye et al. 2020) and
    ``A < 0`` the loss is also capped at ``-c * A``: a huge ratio on a bad
    token cannot produce an unbounded loss, and the capped token gets zero
    gradient. Unclipped tokens have gradient ``-A * ratio`` w.r.t. their
    logprob; clipped ones exactly 0.
    """
    logprobs, old_logprobs, advantages = _sanitize(mask, logprobs, old_logprobs, advantages)
    log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_objective(ratio, advantages, config)
    dual = torch.zeros_like(clipped)
    if config.dual_clip is not None:
        cap = -config.dual_clip * advantages
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
    m = mask > 0
    loss = torch.where(m, loss, 0.0)
    with torch.no_grad():
        metrics = {
            "policy/clip_frac": masked_mean(clipped.to(ratio.dtype), m),
            "policy/dual_clip_frac": masked_mean(dual.to(ratio.dtype), m),
            "policy/approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, m),
            "policy/ratio_mean": masked_mean(ratio, m),
        }
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: AlgorithmConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): one importance ratio per *sequence*,
    ``s_i = exp(mean over generated tokens of (logprobs - old_logprobs))``,
    clipped per sequence with ``clip_low`` / ``clip_high`` (the paper uses
    tiny ranges, e.g. 3e-4 / 4e-4 — the PPO defaults 0.2 / 0.2 are far too
    wide for a length-normalized ratio).

    Implemented as GSPO-token: every token carries
    ``s_i_t = sg[s_i] * exp(logprobs_t - sg[logprobs_t])``, equal to ``s_i``
    in value, with gradient ``s_i`` w.r.t. its own logprob, so that with
    ``seq-mean-token-mean`` aggregation and a per-sequence advantage the
    gradient is exactly the paper's sequence-level one; per-token advantages
    (e.g. from GAE) work too. ``dual_clip`` is not defined for GSPO.
    """
    logprobs, old_logprobs, advantages = _sanitize(mask, logprobs, old_logprobs, advantages)
    m = mask > 0
    seq_log_ratio = masked_mean(logprobs - old_logprobs, m, dim=-1)  # [B]
    # Clamped as verl does (at 10): a length-normalized log-ratio that large is
    # far outside any clip range, so only exp()'s overflow is prevented.
    seq_log_ratio = seq_log_ratio.clamp(max=_MAX_SEQ_LOG_RATIO)
    token_log_ratio = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()
    ratio = torch.exp(token_log_ratio.clamp(max=_MAX_LOG_RATIO))
    loss, clipped = _clipped_objective(ratio, advantages, config)
    loss = torch.where(m, loss, 0.0)
    with torch.no_grad():
        log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        has_tokens = m.any(-1)
        metrics = {
            "policy/clip_frac": masked_mean(clipped.to(ratio.dtype), m),
            "policy/approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, m),
            "policy/ratio_mean": masked_mean(ratio, m),
            "policy/seq_ratio_mean": masked_mean(seq_log_ratio.exp(), has_tokens),
        }
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    config: AlgorithmConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss, per token: ``[B, L]`` (0 where ``mask`` is 0).

    ``v_clip = old_values + clip(values - old_values, -value_clip, value_clip)``
    and ``loss = 0.5 * max((values - returns)**2, (v_clip - returns)**2)``;
    with ``config.value_clip = None`` just ``0.5 * (values - returns)**2``.
    Aggregate it like a policy loss and weight it by ``config.vf_coef``.
    Metrics: ``critic/vf_clip_frac``, ``critic/values_mean``.
    """
    values, old_values, returns = _sanitize(mask, values, old_values, returns)
    m = mask > 0
    loss = (values - returns) ** 2
    clipped = torch.zeros_like(m)
    if config.value_clip is not None:
        c = config.value_clip
        v_clip = old_values + (values - old_values).clamp(-c, c)
        loss_clip = (v_clip - returns) ** 2
        clipped = loss_clip > loss
        loss = torch.maximum(loss, loss_clip)
    loss = torch.where(m, 0.5 * loss, 0.0)
    with torch.no_grad():
        metrics = {
            "critic/vf_clip_frac": masked_mean(clipped.to(values.dtype), m),
            "critic/values_mean": masked_mean(values, m),
        }
    return loss, metrics


# ---------------------------------------------------------------- aggregation

LossAgg = Callable[..., Tensor]
LOSS_AGG: Registry[LossAgg] = Registry("loss aggregation mode")


def loss_normalizers(mask: Tensor) -> dict[str, float]:
    """The global normalizers of a (mini)batch: ``num_tokens`` (generated
    tokens) and ``num_seqs`` (sequences with at least one generated token).
    Compute them once per minibatch and pass them to :func:`aggregate` for
    each of its micro-batches."""
    m = mask > 0
    return {"num_tokens": float(m.sum()), "num_seqs": float(m.any(-1).sum())}


def _positive(n: float | Tensor) -> float | Tensor:
    # An empty micro-batch (or minibatch) contributes a zero loss, not NaN.
    return n.clamp_min(1) if isinstance(n, Tensor) else max(float(n), 1.0)


@LOSS_AGG.register("token-mean")
def token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | Tensor,
    num_seqs: float | Tensor,
    config: AlgorithmConfig | None,
) -> Tensor:
    """Sum over all generated tokens / ``num_tokens``: every token weighs the
    same, so long sequences weigh more (DAPO's token-level loss)."""
    return torch.where(mask > 0, loss_mat, 0.0).sum() / _positive(num_tokens)


@LOSS_AGG.register("seq-mean-token-mean")
def seq_mean_token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | Tensor,
    num_seqs: float | Tensor,
    config: AlgorithmConfig | None,
) -> Tensor:
    """Mean over each sequence's generated tokens, then sum / ``num_seqs``:
    every sequence weighs the same (DeepSeekMath's GRPO objective). The
    per-sequence mean is local to a row, so splitting by rows stays exact."""
    m = mask > 0
    per_seq = torch.where(m, loss_mat, 0.0).sum(-1) / m.sum(-1).clamp_min(1)
    return per_seq.sum() / _positive(num_seqs)


@LOSS_AGG.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | Tensor,
    num_seqs: float | Tensor,
    config: AlgorithmConfig | None,
) -> Tensor:
    """Each sequence's token *sum* divided by the constant
    ``config.loss_norm_tokens`` (e.g. the generation budget), then sum /
    ``num_seqs`` (Dr. GRPO): no length normalization that favours long wrong
    answers, and no dependence on the batch's longest response."""
    if config is None or config.loss_norm_tokens is None:
        raise InvalidConfigError(
            "loss aggregation 'seq-mean-token-sum-norm' needs config.loss_norm_tokens (a "
            "fixed token count such as the generation budget); pass the AlgorithmConfig"
        )
    per_seq = torch.where(mask > 0, loss_mat, 0.0).sum(-1) / config.loss_norm_tokens
    return per_seq.sum() / _positive(num_seqs)


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    config: AlgorithmConfig | None = None,
) -> Tensor:
    """Reduce a ``[B, L]`` loss matrix to a scalar with the ``mode`` of
    :data:`LOSS_AGG`. ``num_tokens`` / ``num_seqs`` default to this batch's
    own (:func:`loss_normalizers`); pass the whole minibatch's when this is
    one of several gradient-accumulation micro-batches."""
    agg = LOSS_AGG.get(mode)
    if num_tokens is None or num_seqs is None:
        own = loss_normalizers(mask)
        num_tokens = own["num_tokens"] if num_tokens is None else num_tokens
        num_seqs = own["num_seqs"] if num_seqs is None else num_seqs
    return agg(loss_mat, mask, num_tokens=num_tokens, num_seqs=num_seqs, config=config)
