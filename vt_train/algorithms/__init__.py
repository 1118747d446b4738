"""RL algorithms as registries: advantage estimators, policy losses, loss
aggregation, KL estimators, and presets over them (pure torch, no model).

One update step reads::

    config = AlgorithmConfig.from_preset("grpo")
    adv, ret = ADVANTAGES.get(config.advantage)(rewards, mask, group_ids, config)
    loss_mat, metrics = POLICY_LOSSES.get(config.policy_loss)(
        logprobs, old_logprobs, adv, mask, config)
    loss = aggregate(loss_mat, mask, config.loss_agg, config=config, **loss_normalizers(mb_mask))

Tensors are token-aligned ``[B, L]`` (index ``t`` describes token ``t``;
``mask`` is 1 exactly on policy-generated tokens).
"""

from vt_train.algorithms.advantages import (
    ADVANTAGES,
    AdvantageEstimator,
    group_filter_mask,
    masked_mean,
    masked_whiten,
    register_advantage,
)
from vt_train.algorithms.config import AlgorithmConfig
from vt_train.algorithms.kl import KL_ESTIMATORS, kl_penalty, kl_token_rewards
from vt_train.algorithms.losses import (
    LOSS_AGG,
    POLICY_LOSSES,
    aggregate,
    loss_normalizers,
    value_loss,
)
from vt_train.algorithms.presets import PRESETS

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSS_AGG",
    "POLICY_LOSSES",
    "PRESETS",
    "AdvantageEstimator",
    "AlgorithmConfig",
    "aggregate",
    "group_filter_mask",
    "kl_penalty",
    "kl_token_rewards",
    "loss_normalizers",
    "masked_mean",
    "masked_whiten",
    "register_advantage",
    "value_loss",
]
