"""SFT warm-up: token-in/token-out data, the masked loss, and that it learns."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from train_helpers import SMALL_MODEL  # noqa: E402

import vt_envs  # noqa: E402
from vt_envs.errors import InvalidConfigError  # noqa: E402
from vt_train.model import TinyModelConfig, build_tiny_model  # noqa: E402
from vt_train.sft import (  # noqa: E402
    SFTConfig,
    collate,
    collect_sft_examples,
    evaluate,
    run_sft,
    sft_loss,
)

SMALL = TinyModelConfig(**SMALL_MODEL)


def test_oracle_examples_are_env_tokens_plus_encoded_actions():
    tok = vt_envs.load_tokenizer()
    (example,) = collect_sft_examples("VT-Lookup-v0", 1)
    env = vt_envs.make("VT-Lookup-v0")
    obs, _ = env.reset(options={"task": env.tasks[0]})
    prompt_len = len(obs["tokens"])
    ids, mask = example.input_ids, example.loss_mask
    assert mask[:prompt_len] == [0] * prompt_len
    # the action spans: exactly <lookup>KEY</lookup> and <answer>VALUE</answer>, stop tag included
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append(tok.decode(ids[start:i]))
            start = None
    assert len(spans) == 2
    assert spans[0].startswith("<lookup>") and spans[0].endswith("</lookup>")
    assert spans[1].startswith("<answer>") and spans[1].endswith("</answer>")
    assert ids[-1] == tok.encode("</answer>")[0]  # the episode ends at the stop tag
    assert example.reward == 1.0 and example.used_tool


def test_mix_replaces_that_fraction_with_guesses():
    examples = collect_sft_examples("VT-Lookup-v0", 20, mix=0.75, seed=3)
    assert sum(not e.used_tool for e in examples) == 15
    tok = vt_envs.load_tokenizer()
    guess = next(e for e in examples if not e.used_tool)
    action = tok.decode([i for i, m in zip(guess.input_ids, guess.loss_mask) if m])
    assert action.startswith("<answer>") and action.endswith("</answer>") and len(action) == 20


def test_masked_loss_ignores_observation_labels():
    model = build_tiny_model(SMALL)
    batch = collate(collect_sft_examples("VT-Lookup-v0", 3, mix=0.34), pad_id=0)
    base = sft_loss(model, **batch)
    labels = batch["input_ids"].clone()
    labels[batch["loss_mask"] == 0] = 1234  # perturb every non-action label
    assert sft_loss(model, **batch, labels=labels).item() == pytest.approx(base.item(), abs=1e-6)
    labels = batch["input_ids"].clone()
    labels[batch["loss_mask"] == 1] = 1234  # perturbing action labels must matter
    assert sft_loss(model, **batch, labels=labels).item() != pytest.approx(base.item(), abs=1e-3)


def test_sft_config_validation():
    with pytest.raises(InvalidConfigError, match="mix"):
        SFTConfig(mix=1.5)
    with pytest.raises(InvalidConfigError, match="held-out"):
        SFTConfig(split="test")


def test_thirty_sft_steps_reduce_the_loss():
    model = build_tiny_model(SMALL)
    config = SFTConfig(
        num_trajectories=64, steps=30, batch_size=8, lr=1e-2, warmup_steps=5, log_every=1
    )
    metrics = run_sft(config, model)
    first = metrics["losses"][0][1]
    assert metrics["oracle_reward"] == 1.0
    assert metrics["final_loss"] < 0.5 * first


def test_evaluate_reports_rates_in_range():
    model = build_tiny_model(SMALL)
    result = evaluate(model, episodes=4, max_new_tokens=4)
    assert result["episodes"] == 4
    assert 0.0 <= result["accuracy"] <= 1.0 and 0.0 <= result["tool_use_rate"] <= 1.0
    assert result["accuracy"] == 0.0  # an untrained model does not solve lookups


def test_sft_command_saves_a_loadable_model_and_metrics(tmp_path):
    from transformers import AutoModelForCausalLM

    from vt_train.sft import SFTRunConfig, run_sft_command

    config = SFTRunConfig(
        model=SMALL,
        sft=SFTConfig(num_trajectories=16, steps=2, batch_size=4),
        mix_phase=SFTConfig(num_trajectories=16, steps=1, batch_size=4, mix=0.5),
        mix_steps=1,
        output_dir=str(tmp_path / "run"),
        eval_episodes=2,
    )
    summary = run_sft_command(config)
    assert set(summary) >= {"phase1", "phase2", "eval_greedy", "eval_sampled", "model_dir"}
    assert summary["phase2"]["tool_use_fraction"] == 0.5
    assert (tmp_path / "run" / "sft_metrics.json").is_file()
    AutoModelForCausalLM.from_pretrained(summary["model_dir"])


def test_the_mix_phase_runs_on_phase_ones_env_teacher_and_next_seed():
    """Phase 2 follows phase 1's env: a Math SFT must not mix in Lookup episodes."""
    from vt_train.sft import SFTRunConfig, mix_phase_config

    teacher = "vt_envs.domains.math.oracle:MathCodePolicy"
    config = SFTRunConfig(
        sft=SFTConfig(env_id="VT-Math-v0", env_kwargs={"difficulty": 1}, teacher=teacher, seed=7),
        mix_steps=9,
    )
    phase2 = mix_phase_config(config)
    assert (phase2.env_id, phase2.env_kwargs, phase2.teacher) == (
        "VT-Math-v0",
        {"difficulty": 1},
        teacher,
    )
    assert (phase2.seed, phase2.steps, phase2.mix) == (8, 9, 0.7)


def test_a_teacher_policy_by_import_path_plays_the_sft_episodes():
    examples = collect_sft_examples(
        "VT-Math-v0",
        3,
        env_kwargs={"families": ["big_product"], "difficulty": 1},
        teacher="vt_envs.domains.math.oracle:MathCodePolicy",
    )
    tok = vt_envs.load_tokenizer()
    for example in examples:
        assert example.reward == 1.0 and example.used_tool
        actions = tok.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])
        assert "print(" in actions and "ORACLE" not in actions
    with pytest.raises(InvalidConfigError, match="module:Class"):
        SFTConfig(teacher="MathCodePolicy")
    with pytest.raises(InvalidConfigError, match="cannot be imported"):
        collect_sft_examples("VT-Lookup-v0", 1, teacher="vt_envs.nowhere:Policy")


def test_sft_and_its_evaluation_show_progress_bars(capsys):
    tok = vt_envs.load_tokenizer()
    model = build_tiny_model(SMALL, tok)
    run_sft(SFTConfig(num_trajectories=4, steps=2, batch_size=2), model, tok, progress=True)
    evaluate(model, tok, episodes=2, progress=True)
    err = capsys.readouterr().err
    for bar in ("SFT episodes", "SFT steps", "SFT eval (greedy)"):
        assert bar in err


@pytest.mark.parametrize("teacher", ["os:getcwd", "vt_envs.vector.mixture:MixturePolicy"])
def test_a_teacher_that_is_not_a_no_argument_policy_is_refused(teacher):
    with pytest.raises(InvalidConfigError, match="not a Policy class"):
        collect_sft_examples("VT-Lookup-v0", 1, teacher=teacher)
