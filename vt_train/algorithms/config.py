"""The one configuration of the RL algorithm: which estimator, loss,
aggregation and KL, and their hyperparameters; validated in one place."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vt_envs.errors import InvalidConfigError, UnknownKwargError
from vt_train.algorithms.advantages import ADVANTAGES
from vt_train.algorithms.kl import KL_ESTIMATORS
from vt_train.algorithms.losses import LOSS_AGG, POLICY_LOSSES

__all__ = ["AlgorithmConfig"]


@dataclass
class AlgorithmConfig:
    """Hyperparameters of one RL algorithm; presets (``grpo``, ``ppo``, ...)
    are named sets of these fields (:meth:`from_preset`).

    Attributes:
        advantage: advantage estimator, a name in ``ADVANTAGES`` (``grpo``,
            ``dr_grpo``, ``rloo``, ``reinforce_pp``, ``gae``).
        policy_loss: policy loss, a name in ``POLICY_LOSSES`` (``ppo_clip``,
            ``gspo``).
        loss_agg: how the ``[B, L]`` loss becomes a scalar, a name in
            ``LOSS_AGG`` (``token-mean``, ``seq-mean-token-mean``,
            ``seq-mean-token-sum-norm``).
        clip_low: the ratio is clipped below at ``1 - clip_low``; in (0, 1).
        clip_high: the ratio is clipped above at ``1 + clip_high``; above
            ``clip_low`` this is DAPO's clip-higher.
        dual_clip: ``None``, or ``c > 1``: for negative advantages the PPO
            loss is capped at ``-c * A`` (dual-clip PPO; ``ppo_clip`` only).
        kl_coef: weight of the KL to the reference policy; 0 turns it off
            (and needs no reference model).
        kl_estimator: per-token KL estimator, a name in ``KL_ESTIMATORS``
            (``k1``, ``k2``, ``k3``).
        kl_in_reward: False: ``kl_coef * KL`` is a loss term. True: ``-kl_coef
            * KL`` is added to the token rewards, which only token-level
            estimators (``reinforce_pp``, ``gae``) can take.
        norm_adv_by_std: ``grpo`` divides by the group's std (GRPO) or not
            (then it equals ``dr_grpo``); other estimators ignore it.
        filter_groups: DAPO's dynamic sampling: the trainer drops groups whose
            rewards are all equal (``group_filter_mask``).
        gamma: discount per *generated* token (``reinforce_pp``, ``gae``).
        lam: GAE's lambda.
        use_critic: train a value head; True exactly when the estimator
            needs values (``gae``).
        value_clip: ``None`` or the PPO value-clip range around the old values.
        vf_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus (subtracted from the loss).
        whiten_advantages: whiten advantages over all generated tokens of the
            batch (masked mean / sample std) after estimation (REINFORCE++,
            PPO).
        loss_norm_tokens: the constant token count of
            ``seq-mean-token-sum-norm`` (Dr. GRPO), e.g. the generation
            budget; required for that mode. The batch's longest response is
            deliberately not a default: it would make the loss scale depend
            on the batch.
        adv_eps: added to standard deviations before dividing.
        rollout_is: truncated importance sampling between the rollout engine
            and the trainer (the engine samples with its own numerics, so
            its logprobs differ from the trainer's): ``None`` (off),
            ``"token"`` (each token's loss times ``min(exp(old - rollout),
            cap)``) or ``"sequence"`` (the trajectory's product of ratios,
            capped, on all its tokens). The gap is logged either way.
        rollout_is_cap: the cap of those weights.
        overlong_shaping: DAPO's soft overlong punishment
            (:mod:`vt_train.algorithms.shaping`): a trajectory whose generated
            tokens run into the last ``overlong_buffer`` of
            ``overlong_max_tokens`` loses reward linearly, up to
            ``overlong_penalty`` (and all of it past the maximum).
        overlong_max_tokens: ``L_max``, generated tokens per trajectory (the
            trainer fills in ``rollout.max_context`` when unset).
        overlong_buffer: ``L_cache``, the ramp's length (unset: a fifth of
            ``overlong_max_tokens``, DAPO's 4,096 of 20,480).
        overlong_penalty: the largest penalty.
    """

    advantage: str = "grpo"
    policy_loss: str = "ppo_clip"
    loss_agg: str = "seq-mean-token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    norm_adv_by_std: bool = True
    filter_groups: bool = False
    gamma: float = 1.0
    lam: float = 1.0
    use_critic: bool = False
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    entropy_coef: float = 0.0
    whiten_advantages: bool = False
    loss_norm_tokens: int | None = None
    adv_eps: float = 1e-6
    rollout_is: str | None = None
    rollout_is_cap: float = 2.0
    overlong_shaping: bool = False
    overlong_max_tokens: int | None = None
    overlong_buffer: int | None = None
    overlong_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.overlong_shaping and self.overlong_buffer is None and self.overlong_max_tokens:
            self.overlong_buffer = max(1, self.overlong_max_tokens // 5)  # DAPO's proportion
        self.validate()

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> AlgorithmConfig:
        """The preset ``name`` (see ``PRESETS``) with ``overrides`` applied,
        e.g. ``AlgorithmConfig.from_preset("dr_grpo", loss_norm_tokens=1024)``.
        Unknown preset names and unknown fields raise typed errors."""
        # Imported here: presets are built from this class.
        from vt_train.algorithms.presets import PRESETS

        fields = {f.name for f in dataclasses.fields(cls)}
        for key in overrides:
            if key not in fields:
                raise UnknownKwargError(f"AlgorithmConfig.from_preset({name!r})", key, fields)
        return cls(**{**PRESETS.get(name), **overrides})

    def validate(self) -> None:
        """Check every field; raise ``UnknownNameError`` for unknown registry
        names and ``InvalidConfigError`` (naming value, reason, fix) for the
        rest. Called on construction; call again after mutating fields."""
        estimator = ADVANTAGES.get(self.advantage)
        POLICY_LOSSES.get(self.policy_loss)
        LOSS_AGG.get(self.loss_agg)
        KL_ESTIMATORS.get(self.kl_estimator)
        critic = "needs" if estimator.needs_values else "does not use"
        # (holds, field, why it must hold, how to fix it)
        checks: list[tuple[bool, str, str, str]] = [
            (0 < self.clip_low < 1, "clip_low",
             "the lower clip bound 1 - clip_low must lie in (0, 1)", "use e.g. 0.2"),
            (0 < self.clip_high < math.inf, "clip_high",
             "the upper clip bound 1 + clip_high must lie above 1",
             "use e.g. 0.2 (0.28 for DAPO's clip-higher)"),
            (self.dual_clip is None or self.dual_clip > 1, "dual_clip",
             "the cap -c * A must lie above the clipped loss, so c > 1",
             "use e.g. 3.0, or None to disable it"),
            (self.dual_clip is None or self.policy_loss == "ppo_clip", "dual_clip",
             f"dual clip is defined for 'ppo_clip', not {self.policy_loss!r}",
             "set dual_clip=None"),
            (self.kl_coef >= 0, "kl_coef",
             "a negative KL weight rewards drifting away from the reference",
             "use 0 (off) or a positive value such as 0.001"),
            (not (self.kl_in_reward and self.kl_coef > 0) or estimator.uses_token_rewards,
             "kl_in_reward",
             f"advantage {self.advantage!r} works on final rewards and cannot take a "
             "per-token KL penalty",
             "set kl_in_reward=False (KL in the loss) or advantage='reinforce_pp' or 'gae'"),
            (0 <= self.gamma <= 1, "gamma", "a discount lies in [0, 1]",
             "use 1.0 for episodic LLM tasks"),
            (0 <= self.lam <= 1, "lam", "GAE's lambda lies in [0, 1]", "use e.g. 0.95 or 1.0"),
            (self.use_critic == estimator.needs_values, "use_critic",
             f"advantage {self.advantage!r} {critic} a critic",
             f"set use_critic={estimator.needs_values}, or advantage='gae' for PPO with a "
             "critic"),
            (self.value_clip is None or self.value_clip > 0, "value_clip",
             "the value-clip range must be positive", "use e.g. 0.2, or None for no clipping"),
            (self.vf_coef >= 0, "vf_coef", "a negative weight would maximize the value error",
             "use e.g. 0.5"),
            (self.entropy_coef >= 0, "entropy_coef",
             "a negative weight would penalize exploration", "use 0 (off) or e.g. 0.001"),
            (self.adv_eps > 0, "adv_eps", "it guards divisions by a zero std", "use e.g. 1e-6"),
            (self.loss_agg != "seq-mean-token-sum-norm"
             or (isinstance(self.loss_norm_tokens, int) and self.loss_norm_tokens > 0),
             "loss_norm_tokens",
             "loss_agg='seq-mean-token-sum-norm' divides each sequence's token sum by this "
             "constant",
             "set it to the generation budget (max new tokens per trajectory), "
             "e.g. loss_norm_tokens=1024"),
            (self.rollout_is in (None, "token", "sequence"), "rollout_is",
             "truncated importance sampling is per token or per sequence",
             "use None (off), 'token' or 'sequence'"),
            (self.rollout_is_cap >= 1, "rollout_is_cap",
             "the weights are capped above at a value >= 1", "use e.g. 2.0"),
            (not self.overlong_shaping
             or (isinstance(self.overlong_max_tokens, int) and self.overlong_max_tokens > 0),
             "overlong_max_tokens", "the overlong punishment measures length against it",
             "set it to the generated-token budget of a trajectory, e.g. 4096"),
            (not self.overlong_shaping or self.overlong_buffer is None
             or 0 < self.overlong_buffer <= (self.overlong_max_tokens or 0),
             "overlong_buffer", "the penalty ramps over the last overlong_buffer tokens "
             "before overlong_max_tokens", "use e.g. a fifth of overlong_max_tokens"),
            (self.overlong_penalty >= 0, "overlong_penalty",
             "a negative penalty would reward overlong answers", "use e.g. 1.0"),
        ]  # fmt: skip
        for holds, name, reason, fix in checks:
            if not holds:
                raise InvalidConfigError(
                    f"AlgorithmConfig.{name}={getattr(self, name)!r} is invalid: {reason}. "
                    f"Fix: {fix}."
                )
