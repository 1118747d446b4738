"""Named algorithms as sets of :class:`AlgorithmConfig` fields.

A preset is a read-only mapping ``field -> value`` over the
:class:`AlgorithmConfig` defaults, not a finished config: ``dr_grpo`` needs
``loss_norm_tokens``, which depends on the run's generation budget, so a
preset is completed and validated by
``AlgorithmConfig.from_preset(name, **overrides)``.

All presets leave ``kl_coef`` at 0 (no reference model to run) but pick the
KL estimator and placement their papers use, so setting ``kl_coef`` is enough
to turn the KL term on in the paper's form.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from vt_train.registry import Registry

__all__ = ["PRESETS"]

PRESETS: Registry[Mapping[str, Any]] = Registry("algorithm preset")


def _preset(name: str, **fields: Any) -> None:
    PRESETS.register(name)(MappingProxyType(fields))


# GRPO (DeepSeekMath): group mean/std advantages, PPO clip 0.2, and its
# objective's 1/|o_i| per-sequence mean, i.e. seq-mean-token-mean (verl
# defaults to token-mean instead; DAPO below is that variant). DeepSeekMath
# used kl_coef=0.04 with k3 in the loss.
_preset(
    "grpo",
    advantage="grpo",
    policy_loss="ppo_clip",
    loss_agg="seq-mean-token-mean",
    clip_low=0.2,
    clip_high=0.2,
    norm_adv_by_std=True,
    kl_estimator="k3",
    kl_in_reward=False,
)

# Dr. GRPO: no std division, and each sequence's token sum divided by a
# constant (pass loss_norm_tokens = the generation budget).
_preset(
    "dr_grpo",
    advantage="dr_grpo",
    policy_loss="ppo_clip",
    loss_agg="seq-mean-token-sum-norm",
    clip_low=0.2,
    clip_high=0.2,
    norm_adv_by_std=False,
    kl_estimator="k3",
    kl_in_reward=False,
)

# DAPO: clip-higher (0.2 / 0.28), token-level loss, dynamic sampling that
# drops groups whose rewards are all equal, and the soft overlong punishment
# (the last fifth of the generated-token budget ramps the reward down by up to
# 1, applied before the groups are filtered). No KL term.
_preset(
    "dapo",
    advantage="grpo",
    policy_loss="ppo_clip",
    loss_agg="token-mean",
    clip_low=0.2,
    clip_high=0.28,
    norm_adv_by_std=True,
    filter_groups=True,
    overlong_shaping=True,
)

# RLOO: leave-one-out baseline within the group. The paper's REINFORCE sums
# token log-probs per sequence, which scales gradients with length; we use
# the PPO-clip loss with token-mean (verl's default for RLOO).
_preset(
    "rloo",
    advantage="rloo",
    policy_loss="ppo_clip",
    loss_agg="token-mean",
    clip_low=0.2,
    clip_high=0.2,
)

# REINFORCE++: token-level returns (with the KL penalty in the reward, k1),
# whitened over the whole batch; PPO clip, token-mean.
_preset(
    "reinforce_pp",
    advantage="reinforce_pp",
    policy_loss="ppo_clip",
    loss_agg="token-mean",
    clip_low=0.2,
    clip_high=0.2,
    gamma=1.0,
    whiten_advantages=True,
    kl_estimator="k1",
    kl_in_reward=True,
)

# PPO with a critic: GAE over generated tokens (lambda 0.95, gamma 1),
# whitened advantages, clipped value loss, KL penalty in the reward (k1) as in
# classic RLHF.
_preset(
    "ppo",
    advantage="gae",
    policy_loss="ppo_clip",
    loss_agg="token-mean",
    clip_low=0.2,
    clip_high=0.2,
    gamma=1.0,
    lam=0.95,
    use_critic=True,
    value_clip=0.2,
    vf_coef=0.5,
    whiten_advantages=True,
    kl_estimator="k1",
    kl_in_reward=True,
)
