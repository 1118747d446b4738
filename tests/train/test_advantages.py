"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from vt_train.algorithms import ADVANTAGES, AlgorithmConfig, group_filter_mask
from vt_train.algorithms.advantages import masked_whiten

GROUP_ESTIMATORS = ["grpo", "dr_grpo", "rloo"]


def one_group(rewards: list[float], length: int = 4) -> tuple[torch.Tensor, ...]:
    r = torch.tensor(rewards)
    mask = torch.ones(len(rewards), length)
    mask[:, 0] = 0  # index 0 never has a logprob
    mask[0, 2] = 0  # an observation token inside the first trajectory
    return r, mask, torch.zeros(len(rewards), dtype=torch.long)


def config_for(name: str, **kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(advantage=name, use_critic=name == "gae", **kw)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("grpo", 0.5 / math.sqrt(1 / 3)),  # sample std of [1,0,0,1] is 0.5774 -> 0.866
        ("dr_grpo", 0.5),
        ("rloo", 2 / 3),  # 1 - mean(0,0,1) = 2/3; 0 - mean(1,0,1) = -2/3
    ],
)
def test_reference_numbers_for_one_group(name: str, expected: float) -> None:
    r, mask, gid = one_group([1, 0, 0, 1])
    adv, ret = ADVANTAGES.get(name)(r, mask, gid, config_for(name))
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0])
    want = signs[:, None] * expected * mask
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)
    assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))
    torch.testing.assert_close(ret, r[:, None] * mask)


def test_grpo_without_std_is_dr_grpo() -> None:
    r, mask, gid = one_group([0.3, 1.0, 0.0, 0.2, 0.9])
    cfg = config_for("grpo", norm_adv_by_std=False)
    torch.testing.assert_close(
        ADVANTAGES.get("grpo")(r, mask, gid, cfg)[0],
        ADVANTAGES.get("dr_grpo")(r, mask, gid, cfg)[0],
    )


def mixed_batch() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 1.0, 0.0, 0.7, 0.3, 2.0])
    group_ids = torch.tensor([7, 7, 3, 3, 3, 7, 9, 9, 9, 42])  # 42: a group of one
    mask = (torch.rand(10, 6, generator=g) > 0.3).float()
    mask[:, 0] = 0
    return rewards, mask, group_ids


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_estimators_do_not_depend_on_row_order(name: str) -> None:
    rewards, mask, group_ids = mixed_batch()
    cfg = config_for(name)
    adv, ret = ADVANTAGES.get(name)(rewards, mask, group_ids, cfg)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(1))
    adv_p, ret_p = ADVANTAGES.get(name)(rewards[perm], mask[perm], group_ids[perm], cfg)
    torch.testing.assert_close(adv_p, adv[perm])
    torch.testing.assert_close(ret_p, ret[perm])
    # Group 7 = rewards [1, 0, 1] (rows 0, 1, 5): computed by hand per estimator.
    row1 = adv[1][mask[1] > 0]
    want = {"grpo": -(2 / 3) / math.sqrt(1 / 3), "dr_grpo": -2 / 3, "rloo": -1.0}[name]
    torch.testing.assert_close(row1, torch.full_like(row1, want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_singleton_and_all_equal_groups_get_zero_advantage(name: str) -> None:
    rewards, mask, group_ids = mixed_batch()
    rewards[2:5] = 0.5  # group 3: all equal
    adv, _ = ADVANTAGES.get(name)(rewards, mask, group_ids, config_for(name))
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[9], torch.zeros(6))  # group 42 has one member
    assert torch.equal(adv[2:5], torch.zeros(3, 6))


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_estimators_refuse_token_rewards(name: str) -> None:
    r, mask, gid = one_group([1, 0])
    with pytest.raises(ValueError, match="kl_in_reward=False"):
        ADVANTAGES.get(name)(r, mask, gid, config_for(name), token_rewards=torch.zeros_like(mask))


def test_group_filter_mask_drops_all_equal_groups() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 0.0, 0.1])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 3, 3, 3, 4, 4])
    keep = group_filter_mask(rewards, group_ids)
    assert keep.tolist() == [False, False, True, True, False, False, False, False, True, True]
    perm = torch.tensor([9, 3, 0, 7, 5, 1, 8, 2, 6, 4])
    assert torch.equal(group_filter_mask(rewards[perm], group_ids[perm]), keep[perm])


def test_masked_whiten_uses_only_masked_entries() -> None:
    x = torch.tensor([[1.0, 2.0, 1e9], [3.0, float("inf"), 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    w = masked_whiten(x, mask, eps=0.0)
    vals = w[mask > 0]
    torch.testing.assert_close(vals.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(vals.std(), torch.tensor(1.0))  # sample std (Bessel)
    assert torch.equal(w[mask == 0], torch.zeros(2))


# ------------------------------------------------------------------ REINFORCE++


def test_reinforce_pp_returns_by_hand() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 1]])
    token_rewards = torch.tensor([[0.0, -0.1, -0.2, 5.0, -0.3]])  # 5.0 is masked: ignored
    cfg = config_for("reinforce_pp", gamma=0.9)
    adv, ret = ADVANTAGES.get("reinforce_pp")(
        torch.tensor([1.0]), mask, torch.tensor([0]), cfg, token_rewards=token_rewards
    )
    # r = [0, -0.1, -0.2, 0, -0.3 + 1]; the discount counts generated tokens only.
    g4 = 0.7
    g2 = -0.2 + 0.9 * g4
    g1 = -0.1 + 0.9 * g2
    torch.testing.assert_close(ret, torch.tensor([[0.0, g1, g2, 0.0, g4]]))
    torch.testing.assert_close(adv, ret)  # whitening off


def test_reinforce_pp_whitens_over_the_batch() -> None:
    rewards, mask, group_ids = mixed_batch()
    cfg = config_for("reinforce_pp", gamma=0.95, whiten_advantages=True)
    adv, ret = ADVANTAGES.get("reinforce_pp")(rewards, mask, group_ids, cfg)
    torch.testing.assert_close(adv, masked_whiten(ret, mask, cfg.adv_eps))
    vals = adv[mask > 0]
    torch.testing.assert_close(vals.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(vals.std(), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))


# ------------------------------------------------------------------ GAE

GAP_MASK = [0, 1, 1, 0, 0, 1]
GAP_VALUES = [9.0, 0.5, 0.6, 9.0, 9.0, 0.7]  # 9.0 sits on observation tokens: never read


def gae_on(mask: list[int], values: list[float], **kw: object) -> tuple[torch.Tensor, ...]:
    cfg = config_for("gae", gamma=0.9, lam=0.8, **kw)
    return ADVANTAGES.get("gae")(
        torch.tensor([1.0]),
        torch.tensor([mask]),
        torch.tensor([0]),
        cfg,
        values=torch.tensor([values]),
    )


def test_gae_with_an_observation_gap() -> None:
    adv, ret = gae_on(GAP_MASK, GAP_VALUES)
    # Generated tokens 1, 2, 5; token 5 is last (reward 1, terminal next state);
    # token 2's next state is token 5, across the observation gap.
    a5 = 1.0 + 0.0 - 0.7  # 0.3
    a2 = (0.9 * 0.7 - 0.6) + 0.9 * 0.8 * a5  # 0.03 + 0.216 = 0.246
    a1 = (0.9 * 0.6 - 0.5) + 0.9 * 0.8 * a2  # 0.04 + 0.17712 = 0.21712
    torch.testing.assert_close(adv, torch.tensor([[0.0, a1, a2, 0.0, 0.0, a5]]))
    torch.testing.assert_close(adv[0, [1, 2, 5]], torch.tensor([0.21712, 0.246, 0.3]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, a1 + 0.5, a2 + 0.6, 0.0, 0.0, 1.0]]))


def test_gae_more_observation_tokens_change_nothing() -> None:
    adv, ret = gae_on(GAP_MASK, GAP_VALUES)
    longer_mask = [0, 1, 1, 0, 0, 0, 0, 0, 1, 0]  # a longer gap and a trailing observation
    longer_values = [9.0, 0.5, 0.6, -3.0, 9.0, 4.0, 9.0, 1.0, 0.7, 5.0]
    adv_l, ret_l = gae_on(longer_mask, longer_values)
    torch.testing.assert_close(adv_l[0, [1, 2, 8]], adv[0, [1, 2, 5]])
    torch.testing.assert_close(ret_l[0, [1, 2, 8]], ret[0, [1, 2, 5]])
    assert torch.equal(adv_l[0, [0, 3, 4, 5, 6, 7, 9]], torch.zeros(7))


def test_gae_with_gamma_lam_one_is_monte_carlo() -> None:
    cfg = config_for("gae", gamma=1.0, lam=1.0)
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 0]])
    values = torch.tensor([[0.0, 0.2, 0.4, 0.0, 0.6], [0.0, 0.0, 0.1, 0.3, 0.0]])
    rewards = torch.tensor([1.0, -1.0])
    adv, ret = ADVANTAGES.get("gae")(rewards, mask, torch.tensor([0, 1]), cfg, values=values)
    torch.testing.assert_close(adv, (rewards[:, None] - values) * mask)
    torch.testing.assert_close(ret, rewards[:, None] * mask)


def test_gae_adds_token_rewards_and_needs_values() -> None:
    cfg = config_for("gae", gamma=1.0, lam=1.0)
    mask = torch.tensor([[0, 1, 1]])
    adv, _ = ADVANTAGES.get("gae")(
        torch.tensor([1.0]),
        mask,
        torch.tensor([0]),
        cfg,
        values=torch.zeros(1, 3),
        token_rewards=torch.tensor([[7.0, -0.1, -0.2]]),
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.7, 0.8]]))
    with pytest.raises(ValueError, match="use_critic=True"):
        ADVANTAGES.get("gae")(torch.tensor([1.0]), mask, torch.tensor([0]), cfg)


def test_estimators_carry_no_gradient_and_declare_flags() -> None:
    values = torch.rand(2, 4, requires_grad=True)
    mask = torch.ones(2, 4)
    adv, ret = ADVANTAGES.get("gae")(
        torch.tensor([1.0, 0.0]), mask, torch.tensor([0, 0]), config_for("gae"), values=values
    )
    assert not adv.requires_grad and not ret.requires_grad
    flags = {
        n: (e.needs_values, e.uses_token_rewards, e.group_based)
        for n, e in ((n, ADVANTAGES.get(n)) for n in ADVANTAGES)
    }
    assert flags == {
        "dr_grpo": (False, False, True),
        "gae": (True, True, False),
        "grpo": (False, False, True),
        "reinforce_pp": (False, True, False),
        "rloo": (False, False, True),
    }
