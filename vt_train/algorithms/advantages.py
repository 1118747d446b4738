"""Advantage estimators: rewards (and values) in, per-token advantages out.

Every estimator is an entry of :data:`ADVANTAGES` with one signature::

    estimator(rewards, mask, group_ids, config, values=None, token_rewards=None)
        -> (advantages, returns)

Arguments (``B`` sequences, ``L`` tokens, token-aligned as in
:mod:`vt_train.trajectory`: index ``t`` describes token ``t``):

- ``rewards``: ``[B]`` float, each trajectory's final (episode) reward.
- ``mask``: ``[B, L]`` loss mask, 1 exactly on policy-generated tokens.
- ``group_ids``: ``[B]`` int, trajectories sampled for the same task share one.
- ``config``: the :class:`~vt_train.algorithms.config.AlgorithmConfig`.
- ``values``: ``[B, L]`` critic values, ``values[t] = V(s_t)`` for the state in
  which token ``t`` was generated (the value head's output at position
  ``t - 1``, the same shift as logprobs). Only estimators with
  ``needs_values`` read it.
- ``token_rewards``: ``[B, L]`` extra per-token rewards, e.g. the KL penalty
  ``-kl_coef * kl`` when ``config.kl_in_reward`` (see
  :func:`vt_train.algorithms.kl.kl_token_rewards`). Only estimators with
  ``uses_token_rewards`` read it; the others reject it rather than ignore it.

Returns ``advantages`` and ``returns``, both ``[B, L]`` float and exactly zero
where ``mask`` is 0. ``returns`` are the value targets (GAE) or the
Monte-Carlo returns; outcome-level estimators return each trajectory's reward
broadcast over its generated tokens. Estimators run under ``torch.no_grad``:
advantages never carry gradient.

Group-based estimators (``grpo``, ``dr_grpo``, ``rloo``) compare a trajectory
with the others of its group. A group of one has nothing to compare with, so
its advantage is 0 (no learning signal); results do not depend on row order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from vt_train.registry import Registry

if TYPE_CHECKING:
    from vt_train.algorithms.config import AlgorithmConfig

__all__ = [
    "ADVANTAGES",
    "AdvantageEstimator",
    "dr_grpo",
    "gae",
    "group_filter_mask",
    "grpo",
    "masked_mean",
    "masked_whiten",
    "register_advantage",
    "reinforce_pp",
    "rloo",
]


class AdvantageEstimator(Protocol):
    """The registry contract (see the module docstring), plus three flags the
    config validates against: ``needs_values`` (a critic is required),
    ``uses_token_rewards`` (can take a KL penalty in the reward) and
    ``group_based`` (compares trajectories within a group)."""

    needs_values: bool
    uses_token_rewards: bool
    group_based: bool

    def __call__(
        self,
        rewards: Tensor,
        mask: Tensor,
        group_ids: Tensor,
        config: AlgorithmConfig,
        values: Tensor | None = None,
        token_rewards: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]: ...


ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")


def register_advantage(
    name: str,
    *,
    needs_values: bool = False,
    uses_token_rewards: bool = False,
    group_based: bool = False,
) -> Callable[[Callable[..., tuple[Tensor, Tensor]]], AdvantageEstimator]:
    """Register ``fn`` under ``name`` with its flags; run it without autograd."""

    def wrap(fn: Callable[..., tuple[Tensor, Tensor]]) -> AdvantageEstimator:
        est = torch.no_grad()(fn)
        est.needs_values = needs_values  # type: ignore[attr-defined]
        est.uses_token_rewards = uses_token_rewards  # type: ignore[attr-defined]
        est.group_based = group_based  # type: ignore[attr-defined]
        return ADVANTAGES.register(name)(est)  # type: ignore[arg-type]

    return wrap


# ---------------------------------------------------------------- helpers


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is nonzero (0 where there
    are none); values at other positions are never read, even ``inf``."""
    m = mask > 0
    x = torch.where(m, x, 0.0)
    if dim is None:
        return x.sum() / m.sum().clamp_min(1)
    return x.sum(dim) / m.sum(dim).clamp_min(1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """``(x - mean) / (std + eps)`` over the masked positions of the whole
    tensor, zero where ``mask`` is 0. The std is the sample std (Bessel's
    correction), the convention GRPO's group std uses too."""
    m = mask > 0
    n = m.sum()
    mean = masked_mean(x, m)
    var = torch.where(m, x - mean, 0.0).pow(2).sum() / (n - 1).clamp_min(1)
    return torch.where(m, (x - mean) / (var.sqrt() + eps), 0.0)


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.float32)


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row group mean, sample std (Bessel) and group size, each ``[B]``.

    Sums go through ``index_add`` over group indices, so the result does not
    depend on where a row sits in the batch (up to float rounding)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts = counts.to(rewards.dtype)
    sums = torch.zeros_like(counts).index_add_(0, inverse, rewards)
    mean = (sums / counts)[inverse]
    sq = torch.zeros_like(counts).index_add_(0, inverse, (rewards - mean) ** 2)
    std = (sq / (counts - 1).clamp_min(1)).sqrt()[inverse]
    return mean, std, counts[inverse]


def _check_shapes(rewards: Tensor, mask: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(
            f"expected rewards [B] and mask [B, L]; got {tuple(rewards.shape)} and "
            f"{tuple(mask.shape)}"
        )
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids must be [B] like rewards {tuple(rewards.shape)}; "
            f"got {tuple(group_ids.shape)}"
        )


def _outcome_output(
    name: str,
    seq_adv: Tensor,
    rewards: Tensor,
    mask: Tensor,
    config: AlgorithmConfig,
    token_rewards: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Broadcast sequence-level advantages over generated tokens (shared tail
    of the group-based estimators)."""
    if token_rewards is not None:
        raise ValueError(
            f"advantage estimator {name!r} works on final rewards only and would ignore "
            "token_rewards; put the KL term in the loss (kl_in_reward=False) or use "
            "'reinforce_pp' / 'gae'"
        )
    m = mask > 0
    advantages = torch.where(m, seq_adv[:, None], 0.0)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, m, config.adv_eps)
    return advantages, torch.where(m, rewards[:, None], 0.0)


def _token_level_rewards(rewards: Tensor, mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """``[B, L]`` rewards: ``token_rewards`` on generated tokens plus the final
    reward on each sequence's last generated token."""
    m = mask.to(rewards.dtype)
    r = torch.zeros_like(m) if token_rewards is None else _float(token_rewards).to(m.dtype) * m
    has_tokens = m.sum(-1) > 0
    positions = torch.arange(m.shape[1], device=m.device)
    last = torch.where(m > 0, positions, -1).amax(-1).clamp_min(0)
    final = torch.where(has_tokens, rewards, torch.zeros_like(rewards))
    return r.index_put((torch.arange(m.shape[0], device=m.device), last), final, accumulate=True)


# ---------------------------------------------------------------- group-based


@register_advantage("grpo", group_based=True)
def grpo(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    config: AlgorithmConfig,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (r_i - mean_g) / (std_g + eps)``
    with the group's sample std (Bessel's correction: rewards [1, 0, 0, 1] give
    +-0.866), or ``r_i - mean_g`` when ``config.norm_adv_by_std`` is False.
    The same advantage on every generated token of the trajectory."""
    _check_shapes(rewards, mask, group_ids)
    r = _float(rewards)
    mean, std, size = _group_stats(r, group_ids)
    adv = r - mean
    if config.norm_adv_by_std:
        adv = adv / (std + config.adv_eps)
    adv = torch.where(size > 1, adv, torch.zeros_like(adv))
    return _outcome_output("grpo", adv, r, mask, config, token_rewards)


@register_advantage("dr_grpo", group_based=True)
def dr_grpo(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    config: AlgorithmConfig,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"):
    ``A_i = r_i - mean_g``, never divided by the std (which up-weights groups
    that are nearly all right or all wrong). ``config.norm_adv_by_std`` is
    not read."""
    _check_shapes(rewards, mask, group_ids)
    r = _float(rewards)
    mean, _, size = _group_stats(r, group_ids)
    adv = torch.where(size > 1, r - mean, torch.zeros_like(r))
    return _outcome_output("dr_grpo", adv, r, mask, config, token_rewards)


@register_advantage("rloo", group_based=True)
def rloo(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    config: AlgorithmConfig,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): REINFORCE with a leave-one-out baseline,
    ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g)``."""
    _check_shapes(rewards, mask, group_ids)
    r = _float(rewards)
    mean, _, size = _group_stats(r, group_ids)
    adv = torch.where(size > 1, (r - mean) * size / (size - 1).clamp_min(1), torch.zeros_like(r))
    return _outcome_output("rloo", adv, r, mask, config, token_rewards)


@torch.no_grad()
def group_filter_mask(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO's dynamic sampling filter: ``[B]`` bool, False for every row of a
    group whose rewards are all equal (including groups of one).

    Such groups have zero group-relative advantage, so they add no gradient
    but still dilute token-mean losses; DAPO drops them (and samples more).
    The trainer drops rows where this is False when ``config.filter_groups``.
    """
    if group_ids.shape != rewards.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_ids must both be [B]; got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    r = _float(rewards)
    hi = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device)
    lo = torch.full((n_groups,), torch.inf, dtype=r.dtype, device=r.device)
    hi = hi.scatter_reduce(0, inverse, r, "amax")
    lo = lo.scatter_reduce(0, inverse, r, "amin")
    return (hi > lo)[inverse]


# ---------------------------------------------------------------- token-level


@register_advantage("reinforce_pp", uses_token_rewards=True)
def reinforce_pp(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    config: AlgorithmConfig,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): no critic, no groups.

    Token rewards are ``token_rewards`` (e.g. ``-kl_coef * kl`` when
    ``kl_in_reward``) plus the final reward on the last generated token. The
    return ``G_t = r_t + gamma * G_next(t)`` runs over *generated* tokens
    only: observation tokens (mask 0) neither add a reward nor count as a
    discount step. With ``config.whiten_advantages`` (the REINFORCE++ preset)
    the advantages are ``G`` whitened over every generated token of the
    batch; without it they are ``G`` itself. ``returns`` is always ``G``.
    """
    _check_shapes(rewards, mask, group_ids)
    r = _token_level_rewards(_float(rewards), mask, token_rewards)
    m = mask.to(r.dtype) > 0
    returns = torch.zeros_like(r)
    g_next = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):  # O(L) steps over [B] vectors
        g = r[:, t] + config.gamma * g_next
        returns[:, t] = torch.where(m[:, t], g, 0.0)
        g_next = torch.where(m[:, t], g, g_next)  # observation tokens carry G through
    advantages = masked_whiten(returns, m, config.adv_eps) if config.whiten_advantages else returns
    return advantages, returns


@register_advantage("gae", needs_values=True, uses_token_rewards=True)
def gae(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    config: AlgorithmConfig,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016) for PPO with a critic, over generated tokens.

    Token rewards as in :func:`reinforce_pp`. Each generated token is one
    action; its "next state" is the next *generated* token's state, however
    many observation tokens (mask 0) lie between them, and the state after
    the last generated token is terminal (value 0). So for generated tokens
    ``t`` with successor ``t'``::

        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A(t')
        returns_t = A_t + V(t)

    Values at observation tokens are never read, and inserting observation
    tokens changes nothing at generated ones. With
    ``config.whiten_advantages`` the advantages (not the returns) are
    whitened over the batch's generated tokens.
    """
    _check_shapes(rewards, mask, group_ids)
    if values is None or values.shape != mask.shape:
        raise ValueError(
            f"'gae' needs values of shape {tuple(mask.shape)} (a critic; use_critic=True); "
            f"got {None if values is None else tuple(values.shape)}"
        )
    r = _token_level_rewards(_float(rewards), mask, token_rewards)
    v = values.to(r.dtype)
    m = mask.to(r.dtype) > 0
    advantages = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_adv = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):  # O(L) steps over [B] vectors
        delta = r[:, t] + config.gamma * next_value - v[:, t]
        a = delta + config.gamma * config.lam * next_adv
        advantages[:, t] = torch.where(m[:, t], a, 0.0)
        # Observation tokens are skipped: the successor's value and advantage carry through.
        next_value = torch.where(m[:, t], v[:, t], next_value)
        next_adv = torch.where(m[:, t], a, next_adv)
    returns = torch.where(m, advantages + v, 0.0)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, m, config.adv_eps)
    return advantages, returns
