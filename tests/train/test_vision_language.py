"""Vision-language policies: rollout and trainer logprobs agree on multimodal sequences,
image tokens stay out of the loss (and are never sampled), images are held once, and the
CPU recipe trains on VT-Visual-v0 through ``vt-train``."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

import vt_envs
from vt_envs.core.task import Task
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.vector import ToolVectorEnv
from vt_train.batch import TrainBatch
from vt_train.engines import HFEngine, SamplingParams, ScriptedEngine
from vt_train.engines.base import Generation, RolloutEngine
from vt_train.logprobs import LogprobModel
from vt_train.model import TinyModelConfig
from vt_train.rollout import collect
from vt_train.vision import ImageInputs, vision_token_ids
from vt_train.vl_model import TinyVisionConfig, build_tiny_vl_model

pytest.importorskip("transformers")

TEXT = TinyModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128,
                       max_position_embeddings=4096)  # fmt: skip
ZOOM = (
    '<tool_call>{"name": "zoom", "arguments": {"bbox": [0, 0, 300, 200], "image": 0}}</tool_call>'
)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    torch.set_num_threads(1)
    processor = tmp_path_factory.mktemp("vl_processor")
    model = build_tiny_vl_model(TEXT, TinyVisionConfig(max_pixels=48 * 28 * 28), processor)
    return model, str(processor), load_tokenizer(str(processor))


def _collect(*args, **kwargs):
    return asyncio.run(collect(*args, **kwargs))


def _venv(processor, width, **kwargs):
    return ToolVectorEnv(
        [
            vt_envs.make("VT-Visual-v0", split="test", processor=processor, **kwargs)
            for _ in range(width)
        ]
    )


def _picture_task(task_id, sizes, seed):
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in sizes]
    markers = " and ".join("<image>" for _ in sizes)
    return Task(task_id, f"Compare {markers}. Which is brighter?", "A",
                assets={"images": images, "choices": ["x", "y"]})  # fmt: skip


class ZoomFirst(RolloutEngine):
    """Turn 1: a scripted zoom call; later turns: the HF engine (whose logprobs are checked)."""

    def __init__(self, engine, tokenizer):
        self.engine, self.ids = engine, [*tokenizer.encode(ZOOM), tokenizer.eos_token_id]

    async def generate(self, prompt_ids, params, *, images=()):
        if len(images) == 1:
            return Generation(list(self.ids), [0.0] * len(self.ids), "eos")
        return await self.engine.generate(prompt_ids, params, images=images)

    def load_weights(self, state_dict):
        self.engine.load_weights(state_dict)

    def score(self, sequences, temperature=1.0, *, images=None):
        return self.engine.score(sequences, temperature, images=images)


def _trainer_logprobs(model, processor, trajectories, pad):
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=pad)
    with torch.no_grad():
        logprobs, _ = LogprobModel(model)(
            batch.input_ids,
            batch.attention_mask,
            positions=batch.loss_mask,
            **ImageInputs(processor)(batch.row_images()),
        )
    return batch, logprobs


def test_rollout_and_trainer_logprobs_agree_on_multimodal_batches(policy):
    model, processor, tokenizer = policy
    engine = HFEngine(model, tokenizer, processor=processor, max_batch_size=8)
    venv = _venv(processor, 6, max_turns=2)
    tasks = [
        _picture_task("one", [(300, 500)], 0),
        _picture_task("two", [(64, 64), (900, 420)], 1),
        _picture_task("three", [(120, 2000), (200, 200), (56, 56)], 2),
        *venv.envs[0].unwrapped.tasks.ids()[:2],  # generated scenes
    ]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    # Rows of different lengths and image counts share the batch (left padding); then a
    # second round whose later turns hold a zoomed image added mid-sequence.
    plain = _collect(engine, venv, tasks, n_samples=2, sampling=sampling, seed=3)
    zoomed = _collect(ZoomFirst(engine, tokenizer), venv, tasks[3:], sampling=sampling, seed=4)
    assert {len(t.images) for t in plain} == {1, 2, 3}
    assert all(len(t.images) == 2 and t.turns == 2 for t in zoomed)
    inputs = ImageInputs(processor)
    for t in plain + zoomed:  # each image's span: vision start, its pads, vision end
        assert len(t.image_spans) == len(t.images)
        for (start, end), image in zip(t.image_spans, t.images):
            span = t.input_ids[start:end]
            assert span[0] == model.config.vision_start_token_id
            assert span[-1] == model.config.vision_end_token_id
            assert span[1:-1] == [model.config.image_token_id] * inputs.tokens(image)
            assert not any(t.loss_mask[start:end])
    for trajectories, skip_first_turn in ((plain, False), (zoomed, True)):
        batch, logprobs = _trainer_logprobs(model, processor, trajectories, tokenizer.pad_token_id)
        mask = batch.loss_mask.bool()
        if skip_first_turn:  # the scripted zoom's ids: compare the HF engine's turn only
            for row, t in enumerate(trajectories):
                first_obs = t.input_ids.index(
                    tokenizer.encode("<|vision_start|>")[0], t.prompt_length
                )
                mask[row, :first_obs] = False
        assert mask.sum() > 10
        gap = (logprobs - batch.rollout_logprobs)[mask].abs()
        assert float(gap.max()) < 1e-5, float(gap.max())
    venv.close()


def test_image_tokens_are_observation_ids_and_never_sampled(policy):
    model, processor, tokenizer = policy
    banned = vision_token_ids(model.config)
    assert len(banned) == 4
    engine = HFEngine(model, tokenizer, processor=processor)
    # Make the policy all but certain to pick an image pad: it must still never sample one.
    engine.model.lm_head.register_forward_hook(
        lambda module, args, out: out.index_add(
            -1, torch.tensor(banned), torch.full((*out.shape[:-1], len(banned)), 50.0)
        )
    )
    venv = _venv(processor, 4, max_turns=2)
    tasks = venv.envs[0].unwrapped.tasks.ids()[:4]
    trajectories = _collect(engine, venv, tasks, sampling=SamplingParams(max_new_tokens=8), seed=0)
    venv.close()
    generated = [i for t in trajectories for i, m in zip(t.input_ids, t.loss_mask) if m]
    assert generated and not set(generated) & set(banned)
    assert all(np.isfinite(t.rollout_logprobs).all() for t in trajectories)
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)
    is_image = torch.isin(batch.input_ids, torch.tensor(banned)) & batch.attention_mask.bool()
    assert int(is_image.sum()) > 100  # every prompt holds an image span
    assert float(batch.loss_mask[is_image].sum()) == 0.0  # none of them is in the loss
    with torch.no_grad():  # the trainer gives them probability 0, as the engine samples
        ids = torch.tensor([[*trajectories[0].input_ids[:50], banned[0]]])  # a vision start
        logprobs, _ = LogprobModel(model)(ids, torch.ones_like(ids))
    assert logprobs[0, -1] == float("-inf") and torch.isfinite(logprobs[0, 1:-1]).all()


def test_a_64_trajectory_batch_holds_each_image_once():
    tokenizer = load_tokenizer(None)
    zoom = [*tokenizer.encode(ZOOM), tokenizer.eos_token_id]
    second = '<tool_call>{"name": "zoom", "arguments": {"bbox": [10, 10, 90, 60]}}</tool_call>'
    zoom_again = [*tokenizer.encode(second), tokenizer.eos_token_id]
    answer = [*tokenizer.encode("<answer>A</answer>"), tokenizer.eos_token_id]

    def respond(prompt):
        calls = prompt.count(tokenizer.encode("<tool_call>")[0])
        return (zoom, zoom_again, answer)[min(calls - 1, 2)]  # the prompt's example counts once

    engine = ScriptedEngine(respond, eos_token_id=tokenizer.eos_token_id, tokenizer=tokenizer)
    venv = ToolVectorEnv([vt_envs.make("VT-Visual-v0", split="test") for _ in range(16)])
    tasks = venv.envs[0].unwrapped.tasks.ids()[:8]
    trajectories = _collect(engine, venv, tasks, n_samples=8, seed=0)
    venv.close()
    assert len(trajectories) == 64 and all(len(t.images) == 3 for t in trajectories)
    image_id = tokenizer.encode("<image>")[0]
    for t in trajectories:
        assert [t.input_ids[a:b] for a, b in t.image_spans] == [[image_id]] * 3
    batch = TrainBatch.from_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)
    views = [batch, *batch.minibatches(16, shuffle=True), *batch.split(8)]
    held = {id(image): image for view in views for image in view.row_images()}
    assert len(held) == 8 * 3  # a task image and two zooms per group, once each
    listed = list(held.values())
    for k, first in enumerate(listed):
        for other in listed[k + 1 :]:
            assert not np.shares_memory(first, other)
            assert first.shape != other.shape or not np.array_equal(first, other)
    # The engine was given the trajectories' own arrays, not copies.
    given = {id(image) for request in engine.images for image in request}
    assert given <= set(held) | {id(i) for t in trajectories for i in t.images}
    assert not any(isinstance(v, torch.Tensor) and v.dim() > 2 for v in vars(batch).values())


@pytest.mark.parametrize(
    "algo, steps", [pytest.param("grpo", 2, marks=pytest.mark.slow), ("ppo", 1)]
)
def test_the_cpu_recipe_trains_on_vt_visual(tmp_path, algo, steps):
    from vt_train.cli import main
    from vt_train.vision import is_vision_language, load_policy

    out = tmp_path / "run"
    argv = ["configs/visual_grpo_cpu.yaml", f"algo={algo}", f"steps={steps}", f"output_dir={out}"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    updates = [r for r in records if "policy/grad_norm" in r]
    assert len(updates) == steps
    for record in updates:
        assert record["rollout/logprob_max_abs_diff"] < 1e-4  # rollout vs trainer, with images
        assert record["sync/max_abs_logprob_diff"] < 1e-4  # the probe holds image spans
        assert np.isfinite(record["sync/mean_abs_logprob_diff"])
    if algo == "ppo":
        assert np.isfinite(updates[0]["critic/vf_loss"])
    final = load_policy(out / "final")
    assert is_vision_language(final)
    assert (out / "final" / "preprocessor_config.json").is_file()


def test_a_text_engine_refuses_images(policy):
    from vt_envs.errors import InvalidConfigError
    from vt_train.model import build_tiny_model

    engine = HFEngine(build_tiny_model(TinyModelConfig(hidden_size=32, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64)))  # fmt: skip
    image = np.zeros((56, 56, 3), np.uint8)
    with pytest.raises(InvalidConfigError, match="text-only"):
        asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2), images=[image]))


def test_a_request_whose_prefill_fails_raises_instead_of_hanging(policy):
    from vt_envs.errors import InvalidConfigError

    model, processor, tokenizer = policy
    engine = HFEngine(model, tokenizer, processor=processor)
    pad = model.config.image_token_id
    image = np.zeros((56, 56, 3), np.uint8)  # 4 image tokens, but the prompt holds 3 pads
    prompt = [
        1,
        model.config.vision_start_token_id,
        pad,
        pad,
        pad,
        model.config.vision_end_token_id,
    ]

    async def both():
        bad = engine.generate(prompt, SamplingParams(max_new_tokens=2), images=[image])
        good = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        return await asyncio.wait_for(asyncio.gather(bad, good, return_exceptions=True), 60)

    bad, good = asyncio.run(both())
    assert isinstance(bad, InvalidConfigError) and "holds 3 image-pad ids" in str(bad)
    assert "fill 4" in str(bad) and len(good.token_ids) == 2
    # A failure deep in the prefill (a broken processor) fails its request, not the engine.
    engine._images.check_prompt = lambda *args: None
    bad, good = asyncio.run(both())
    assert isinstance(bad, RuntimeError) and len(good.token_ids) == 2
