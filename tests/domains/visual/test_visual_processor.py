"""With a Qwen2-VL processor, the env's ids are exactly the processor's own expansion."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from tokenizers import Tokenizer

from vt_envs.core.image_tokens import image_spec_from_config
from vt_envs.core.task import Task
from vt_envs.core.tokenizer import CHATML_TEMPLATE, DEFAULT_TOKENIZER_DIR, VTTokenizer
from vt_envs.core.vl_processor import write_qwen_vl_processor
from vt_envs.errors import InvalidConfigError

transformers = pytest.importorskip("transformers")

MAX_PIXELS = 256 * 28 * 28
SIZES = [(64, 64), (300, 500), (1126, 1345), (37, 2000), (1024, 1024)]


@pytest.fixture(scope="module")
def processor_dir(tmp_path_factory):
    return write_qwen_vl_processor(tmp_path_factory.mktemp("qwen_vl"), max_pixels=MAX_PIXELS)


@pytest.fixture(scope="module")
def hf_processor(processor_dir):
    """transformers' own Qwen2VLProcessor over the directory (no video processor: without
    torchvision, transformers cannot resolve its class, so that one check is skipped)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(processor_dir, local_files_only=True)
    images = transformers.Qwen2VLImageProcessor.from_pretrained(
        processor_dir, local_files_only=True
    )
    cls = transformers.Qwen2VLProcessor
    try:
        return cls(image_processor=images, tokenizer=tokenizer)
    except (AttributeError, ValueError, TypeError):
        original = cls.check_argument_for_proper_class
        cls.check_argument_for_proper_class = lambda self, name, arg: None
        try:
            return cls(image_processor=images, tokenizer=tokenizer, video_processor=None)
        finally:
            cls.check_argument_for_proper_class = original


def _expected(hf_processor, messages, images):
    text = hf_processor.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    out = hf_processor(text=[text], images=list(images), return_tensors="np")
    return out["input_ids"][0].tolist(), out["image_grid_thw"]


def _task(height, width, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Task(
        f"img/{height}x{width}",
        f"<image>\n(Image 0: {width}x{height} pixels.)\nWhat is in it?",
        "A",
        assets={"images": [image], "choices": ["x", "y"], "image_size": (width, height)},
    )


@pytest.mark.parametrize("height, width", SIZES)
def test_prompt_ids_match_the_processor_for_each_image_size(
    processor_dir, hf_processor, height, width
):
    env = gym.make("VT-Visual-v0", processor=str(processor_dir))
    obs, info = env.reset(options={"task": _task(height, width)})
    expected, grid = _expected(hf_processor, info["messages"], obs["images"])
    assert obs["tokens"].tolist() == expected
    pads = int(np.prod(grid[0])) // 4
    assert info["image_tokens"] == [pads + 2]  # vision start + pads + vision end
    assert info["episode_image_tokens"] == pads + 2
    env.close()


def test_a_whole_conversation_with_a_zoom_matches_the_processor(processor_dir, hf_processor):
    env = gym.make("VT-Visual-v0", split="test", processor=str(processor_dir))
    tokenizer = env.unwrapped.tokenizer
    obs, info = env.reset(seed=0)
    ids, images, messages = obs["tokens"].tolist(), list(obs["images"]), list(info["messages"])
    action = '<tool_call>{"name": "zoom", "arguments": {"bbox": [10, 10, 210, 110]}}</tool_call>'
    action_ids = [*tokenizer.encode(action), tokenizer.eos_token_id]
    obs, _, _, _, info = env.step(action_ids)
    ids += [*action_ids, *obs["tokens"].tolist()]
    images += obs["images"]
    messages += [{"role": "assistant", "content": action}, info["message"]]
    expected, grid = _expected(hf_processor, messages, images)
    assert ids == expected
    assert len(grid) == 2 and info["episode_image_tokens"] == sum(
        int(np.prod(g)) // 4 + 2 for g in grid
    )
    env.close()


def test_the_budget_counts_expanded_tokens_and_the_transcript_collapses_them(processor_dir):
    env = gym.make(
        "VT-Visual-v0",
        split="test",
        processor=str(processor_dir),
        max_image_tokens=400,
        render_mode="ansi",
    )
    obs, info = env.reset(seed=0)
    first = info["episode_image_tokens"]
    assert 200 < first < 400
    zoom = '<tool_call>{"name": "zoom", "arguments": {"bbox": [0, 0, 300, 300]}}</tool_call>'
    transcript = env.render()
    assert transcript.count("<|vision_start|><|image_pad|><|vision_end|>") == 1
    assert len(obs["text"]) > len(transcript)  # the observation holds every pad
    _, _, terminated, truncated, info = env.step(zoom)
    assert truncated and not terminated and info["truncation"] == "max_image_tokens"
    env.close()


def test_processor_errors_are_typed(tmp_path, processor_dir):
    with pytest.raises(InvalidConfigError, match=r"preprocessor_config\.json"):
        gym.make("VT-Visual-v0", processor=str(tmp_path))
    # The shipped tokenizer has no vision tokens: it cannot carry a processor's expansion.
    with pytest.raises(InvalidConfigError, match="no special token '<\\|vision_start\\|>'"):
        gym.make("VT-Visual-v0", processor=str(processor_dir), tokenizer=str(DEFAULT_TOKENIZER_DIR))
    data = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<image>"]
    plain = VTTokenizer(
        Tokenizer.from_str(json.dumps(data)), CHATML_TEMPLATE, eos_token="<|im_end|>"
    )
    with pytest.raises(InvalidConfigError, match="no special token '<image>'"):
        gym.make("VT-Visual-v0", tokenizer=plain)


def test_geometry_is_read_from_old_and_new_config_fields():
    new = image_spec_from_config({"size": {"shortest_edge": 100, "longest_edge": 5000}})
    old = image_spec_from_config({"min_pixels": 200, "max_pixels": 6000, "size": {}})
    both = image_spec_from_config(
        {"min_pixels": 300, "max_pixels": 7000, "size": {"shortest_edge": 1, "longest_edge": 2}}
    )
    assert (new.min_pixels, new.max_pixels) == (100, 5000)
    assert (old.min_pixels, old.max_pixels) == (200, 6000)
    assert (both.min_pixels, both.max_pixels) == (300, 7000)
    assert image_spec_from_config(json.loads('{"patch_size": 16, "merge_size": 2}')).factor == 32


def test_a_processor_object_gives_the_same_ids_as_its_directory(processor_dir, hf_processor):
    by_path = gym.make("VT-Visual-v0", split="test", processor=str(processor_dir))
    by_object = gym.make("VT-Visual-v0", split="test", processor=hf_processor)
    first, _ = by_path.reset(seed=2)
    second, _ = by_object.reset(seed=2)
    assert first["tokens"].tolist() == second["tokens"].tolist()
    by_path.close()
    by_object.close()


def test_a_text_env_takes_the_processor_for_its_tokenizer(processor_dir):
    env = gym.make("VT-Lookup-v0", processor=str(processor_dir))
    tokenizer = env.unwrapped.tokenizer
    assert tokenizer.vocab_size == 2052
    assert "images" not in env.observation_space.spaces
    env.close()
