"""Presets, AlgorithmConfig validation, and the public API of vt_train.algorithms."""

from __future__ import annotations

import pytest

import vt_train.algorithms as algorithms
from vt_envs.errors import InvalidConfigError, UnknownKwargError, UnknownNameError
from vt_train.algorithms import PRESETS, AlgorithmConfig

# The table the presets' comments document.
EXPECTED = {
    "grpo": dict(
        advantage="grpo",
        loss_agg="seq-mean-token-mean",
        clip_high=0.2,
        norm_adv_by_std=True,
        filter_groups=False,
        use_critic=False,
    ),
    "dr_grpo": dict(
        advantage="dr_grpo",
        loss_agg="seq-mean-token-sum-norm",
        norm_adv_by_std=False,
        use_critic=False,
    ),
    "dapo": dict(
        advantage="grpo",
        loss_agg="token-mean",
        clip_low=0.2,
        clip_high=0.28,
        filter_groups=True,
        kl_coef=0.0,
        overlong_shaping=True,
        overlong_buffer=102,  # a fifth of overlong_max_tokens=512
    ),
    "rloo": dict(advantage="rloo", loss_agg="token-mean", use_critic=False),
    "reinforce_pp": dict(
        advantage="reinforce_pp",
        whiten_advantages=True,
        kl_in_reward=True,
        kl_estimator="k1",
        use_critic=False,
    ),
    "ppo": dict(
        advantage="gae",
        use_critic=True,
        lam=0.95,
        gamma=1.0,
        whiten_advantages=True,
        value_clip=0.2,
        vf_coef=0.5,
    ),
}


def test_the_six_presets_exist() -> None:
    assert PRESETS.names() == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_fields(name: str) -> None:
    cfg = AlgorithmConfig.from_preset(name, loss_norm_tokens=512, overlong_max_tokens=512)
    for field, value in EXPECTED[name].items():
        assert getattr(cfg, field) == value, field
    assert cfg.policy_loss == "ppo_clip"


def test_overrides_apply_and_revalidate() -> None:
    cfg = AlgorithmConfig.from_preset("grpo", kl_coef=0.04, clip_high=0.28)
    assert (cfg.kl_coef, cfg.clip_high, cfg.advantage) == (0.04, 0.28, "grpo")
    gspo = AlgorithmConfig.from_preset("grpo", policy_loss="gspo", clip_low=3e-4, clip_high=4e-4)
    assert gspo.policy_loss == "gspo"
    with pytest.raises(InvalidConfigError, match="use_critic"):
        AlgorithmConfig.from_preset("ppo", use_critic=False)


def test_dr_grpo_requires_the_normalizing_constant() -> None:
    with pytest.raises(InvalidConfigError) as err:
        AlgorithmConfig.from_preset("dr_grpo")
    assert str(err.value) == (
        "AlgorithmConfig.loss_norm_tokens=None is invalid: loss_agg='seq-mean-token-sum-norm' "
        "divides each sequence's token sum by this constant. Fix: set it to the generation "
        "budget (max new tokens per trajectory), e.g. loss_norm_tokens=1024."
    )
    assert AlgorithmConfig.from_preset("dr_grpo", loss_norm_tokens=1024).loss_norm_tokens == 1024


def test_unknown_preset_message() -> None:
    with pytest.raises(UnknownNameError) as err:
        AlgorithmConfig.from_preset("grpoo")
    assert str(err.value) == (
        "Unknown algorithm preset 'grpoo'. Did you mean 'grpo'? "
        "Known algorithm presets: dapo, dr_grpo, grpo, ppo, reinforce_pp, rloo. "
        "Register one first (imports: [my_module] in a recipe, --import on the command "
        "line) or name it as 'module:attr'."
    )


@pytest.mark.parametrize(
    "field, value, known",
    [
        ("advantage", "reinforce++", "dr_grpo, gae, grpo, reinforce_pp, rloo"),
        ("policy_loss", "ppo", "gspo, ppo_clip"),
        ("loss_agg", "token_mean", "seq-mean-token-mean, seq-mean-token-sum-norm, token-mean"),
    ],
)
def test_unknown_registry_names_list_the_valid_ones(field: str, value: str, known: str) -> None:
    with pytest.raises(UnknownNameError, match=f"Known .*: {known}\\."):
        AlgorithmConfig(**{field: value})


def test_unknown_override_keyword() -> None:
    with pytest.raises(UnknownKwargError, match="Did you mean 'kl_coef'"):
        AlgorithmConfig.from_preset("grpo", kl_coeff=0.1)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(clip_low=1.0), "clip_low"),
        (dict(clip_low=0.0), "clip_low"),
        (dict(clip_high=-0.1), "clip_high"),
        (dict(dual_clip=1.0), "dual_clip"),
        (dict(policy_loss="gspo", dual_clip=3.0), "dual_clip"),
        (dict(kl_coef=-0.1), "kl_coef"),
        (dict(kl_in_reward=True, kl_coef=0.1), "kl_in_reward"),  # grpo takes no token rewards
        (dict(gamma=1.5), "gamma"),
        (dict(lam=-0.1), "lam"),
        (dict(use_critic=True), "use_critic"),  # grpo has no critic
        (dict(advantage="gae"), "use_critic"),  # gae needs one
        (dict(value_clip=0.0), "value_clip"),
        (dict(vf_coef=-1.0), "vf_coef"),
        (dict(entropy_coef=-0.01), "entropy_coef"),
        (dict(adv_eps=0.0), "adv_eps"),
        (dict(loss_agg="seq-mean-token-sum-norm", loss_norm_tokens=0), "loss_norm_tokens"),
    ],
)
def test_invalid_values_name_the_field_and_a_fix(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidConfigError, match=f"^AlgorithmConfig\\.{field}=.*Fix: "):
        AlgorithmConfig(**kwargs)


def test_kl_in_reward_is_fine_for_token_level_estimators_or_without_kl() -> None:
    AlgorithmConfig(advantage="reinforce_pp", kl_in_reward=True, kl_coef=0.1)
    AlgorithmConfig(advantage="gae", use_critic=True, kl_in_reward=True, kl_coef=0.1)
    AlgorithmConfig(advantage="grpo", kl_in_reward=True, kl_coef=0.0)


def test_validate_after_mutation() -> None:
    cfg = AlgorithmConfig()
    cfg.clip_low = 2.0
    with pytest.raises(InvalidConfigError, match="clip_low"):
        cfg.validate()


def test_presets_are_read_only() -> None:
    with pytest.raises(TypeError):
        PRESETS.get("grpo")["clip_high"] = 0.5  # type: ignore[index]


def test_public_api_is_honest() -> None:
    for name in algorithms.__all__:
        assert hasattr(algorithms, name), name
    assert {
        "AlgorithmConfig",
        "ADVANTAGES",
        "POLICY_LOSSES",
        "LOSS_AGG",
        "KL_ESTIMATORS",
        "PRESETS",
        "aggregate",
        "value_loss",
        "group_filter_mask",
    } <= set(algorithms.__all__)
