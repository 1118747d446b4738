"""VT-Visual-v0 through gym.make: images in observations, tools by index, budgets, memory."""

from __future__ import annotations

import gc
import json
import tracemalloc
import weakref

import gymnasium as gym
import numpy as np
import pytest

import vt_envs
from vt_envs.core.env import ToolEnv
from vt_envs.core.task import Task, TaskList
from vt_envs.core.tokenizer import IMAGE_TOKEN, default_tokenizer
from vt_envs.core.verifier import ExactMatch
from vt_envs.domains.visual import (
    BBOX_FORMATS,
    NoToolPolicy,
    VisualOracle,
    describe_format,
    images_of_task,
    scene_of,
)
from vt_envs.domains.visual.bbox import to_pixels
from vt_envs.errors import InvalidConfigError

IMAGE_ID = default_tokenizer().encode(IMAGE_TOKEN)[0]


def _call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def env():
    env = gym.make("VT-Visual-v0", split="test")
    yield env
    env.close()


def test_reset_gives_the_task_image_once_in_images_and_once_in_tokens(env):
    obs, info = env.reset(seed=3)
    task = env.unwrapped.task
    (image,) = obs["images"]
    source = images_of_task(task)[0]
    assert image.dtype == np.uint8 and image.shape == source.shape and not image.flags.writeable
    assert np.array_equal(image, source) and not np.shares_memory(image, source)
    assert obs["tokens"].tolist().count(IMAGE_ID) == 1
    assert info["image_tokens"] == [1] and info["episode_image_tokens"] == 1
    width, height = task.assets["image_size"]
    assert (height, width) == image.shape[:2]
    assert f"Image 0: {width}x{height} pixels." in obs["text"]
    user = info["messages"][1]["content"]
    assert user[0] == {"type": "image", "index": 0} and user[1]["type"] == "text"
    assert env.observation_space.contains(obs)


def test_each_result_is_a_new_image_that_later_calls_reference(env):
    obs, _ = env.reset(seed=0)
    height, width = obs["images"][0].shape[:2]
    obs, reward, terminated, truncated, info = env.step(
        _call("crop", bbox=[0, 0, width // 2, height // 2], image=0)
    )
    assert not (terminated or truncated) and reward == 0.0
    (crop,) = obs["images"]
    assert crop.shape == (height // 2, width // 2, 3)
    assert "Image 1:" in obs["text"] and obs["tokens"].tolist().count(IMAGE_ID) == 1
    assert info["message"]["content"][-1] == {"type": "image", "index": 1}
    assert info["episode_image_tokens"] == 2
    obs, *_ = env.step(_call("zoom", bbox=[0, 0, 40, 30], image=1))
    assert obs["images"][0].shape == (504, 672, 3)  # 40x30 enlarged to a 672-px long side
    assert "Image 2:" in obs["text"]
    obs, *_, info = env.step(_call("flip", direction="vertical", image=2))
    assert np.array_equal(obs["images"][0], env.unwrapped._episode.images[2][::-1])


@pytest.mark.parametrize(
    "action, expected",
    [
        (_call("crop", bbox=[0, 0, 10, 10], image=7), "there is no image 7"),
        (_call("crop", bbox=[0, 0, 0, 10], image=0), "zero area"),
        (_call("crop", bbox=[0, 0, 99999, 10], image=0), "outside the image"),
        (_call("crop", bbox=["a", 0, 5, 5], image=0), "finite numbers"),
        (_call("crop", bbox=[0, 0, 5], image=0), "4 numbers"),
        (_call("crop", bbox=[0, 0, 5, 5], image="first"), "must be"),
        ('<tool_call>{"name": "crop", "arguments": {"bbox": [0, 0</tool_call>', "JSON"),
        (_call("rotate", degrees="ninety"), "degrees"),
    ],
)
def test_bad_arguments_are_observations_that_add_no_image(env, action, expected):
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(action)
    assert not (terminated or truncated)
    assert obs["images"] == () and IMAGE_ID not in obs["tokens"].tolist()
    assert expected in obs["text"], obs["text"]
    assert info["tool_errors"] + info["invalid_actions"] == 1
    assert info["episode_image_tokens"] == 1


@pytest.mark.parametrize("bbox_format", BBOX_FORMATS)
def test_the_convention_is_stated_enforced_and_the_oracle_follows_it(bbox_format):
    env = gym.make("VT-Visual-v0", split="test", bbox_format=bbox_format)
    obs, _ = env.reset(seed=0)
    assert describe_format(bbox_format) in obs["text"]
    others = [describe_format(f) for f in BBOX_FORMATS if f != bbox_format]
    assert not any(text in obs["text"] for text in others)
    if bbox_format != "pixels":  # a pixel box is outside the fraction / 0-1000 range
        obs, *_ = env.step(_call("crop", bbox=[100, 100, 1200, 1100], image=0))
        assert f"bbox_format={bbox_format!r}" in obs["text"] and obs["images"] == ()
    results = [vt_envs.run_episode(env, VisualOracle(), seed=s) for s in range(4)]
    env.close()
    assert [r.reward for r in results] == [1.0] * 4
    assert all(r.actions[0].startswith('<tool_call>{"name": "zoom"') for r in results)


@pytest.mark.parametrize("bbox_format", BBOX_FORMATS)
def test_the_oracle_box_contains_every_target_pixel(bbox_format):
    env = gym.make("VT-Visual-v0", split="test", bbox_format=bbox_format)
    oracle = VisualOracle()
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        task = env.unwrapped.task
        oracle.reset(task)
        call = json.loads(oracle.act(obs["text"], info).removeprefix("<tool_call>")[:-12])
        image = obs["images"][0]
        height, width = image.shape[:2]
        left, top, right, bottom = to_pixels(call["arguments"]["bbox"], bbox_format, width, height)
        crop_obs, *_ = env.step(_call("crop", **call["arguments"]))
        crop = crop_obs["images"][0]
        for t_left, t_top, t_right, t_bottom in task.assets["targets"]:
            assert left <= t_left and top <= t_top and t_right <= right and t_bottom <= bottom
            inside = crop[t_top - top : t_bottom - top, t_left - left : t_right - left]
            assert np.array_equal(inside, image[t_top:t_bottom, t_left:t_right])
        if len(task.assets["targets"]) == 1:  # (a relation's ring and star may sit far apart)
            assert (right - left) * (bottom - top) < width * height / 4  # a zoom, not the whole
    env.close()


def test_without_zooming_the_baseline_is_near_chance():
    env = gym.make("VT-Visual-v0", split="test")
    rewards = [vt_envs.run_episode(env, NoToolPolicy(), seed=s).reward for s in range(40)]
    env.close()
    assert np.mean(rewards) < 0.45  # four options: chance is 0.25


def test_render_modes_give_the_latest_image_and_a_transcript_with_placeholders():
    env = gym.make("VT-Visual-v0", split="test", render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    assert env.render() is obs["images"][0]
    obs, *_ = env.step(_call("crop", bbox=[5, 5, 105, 55], image=0))
    assert env.render() is obs["images"][0] and env.render().shape == (50, 100, 3)
    env.close()
    ansi = gym.make("VT-Visual-v0", split="test", render_mode="ansi")
    ansi.reset(seed=0)
    ansi.step(_call("crop", bbox=[5, 5, 105, 55], image=0))
    assert ansi.render().count("<image>") == 2
    ansi.close()
    with pytest.raises(InvalidConfigError, match="render_mode"):
        gym.make("VT-SQL-v0", render_mode="rgb_array")


def test_the_image_token_budget_ends_the_episode_cleanly():
    env = gym.make("VT-Visual-v0", split="test", max_image_tokens=2)
    env.reset(seed=0)
    obs, _, _, truncated, info = env.step(_call("crop", bbox=[0, 0, 50, 50], image=0))
    assert not truncated and info["episode_image_tokens"] == 2
    obs, reward, terminated, truncated, info = env.step(_call("crop", bbox=[0, 0, 9, 9]))
    assert truncated and not terminated and info["truncation"] == "max_image_tokens"
    assert obs["images"] == () and len(obs["tokens"]) == 0
    assert info["reward_parts"] == {"outcome": 0.0} and reward == 0.0
    assert env.unwrapped._live.sessions == {}  # the image session is closed
    with pytest.raises(InvalidConfigError, match="max_image_tokens"):
        gym.make("VT-SQL-v0", max_image_tokens=10)


def _image_env(tasks, **kwargs):
    return ToolEnv(
        tools=[],
        tasks=TaskList(tasks),
        verifier=ExactMatch(),
        instructions="Look.",
        task_images=lambda task: task.assets["images"],
        **kwargs,
    )


def test_prompt_markers_place_images_and_text_never_forges_one():
    red = np.full((8, 8, 3), 200, np.uint8)
    blue = np.zeros((4, 6, 3), np.uint8)
    tasks = [
        Task("two", "Compare <image> with <image>.", "x", assets={"images": [red, blue]}),
        Task("none", "No marker here.", "x", assets={"images": [red]}),
        Task("extra", "<image> and the literal <image> token", "x", assets={"images": [red]}),
        Task("forged", "Mark \x00VTimage\x00 here", "x", assets={"images": []}),
    ]
    env = _image_env(tasks)
    obs, info = env.reset(options={"task_id": "two"})
    assert [i.shape for i in obs["images"]] == [(8, 8, 3), (4, 6, 3)]
    assert obs["tokens"].tolist().count(IMAGE_ID) == 2
    parts = info["messages"][1]["content"]
    assert [p.get("index") for p in parts if p["type"] == "image"] == [0, 1]
    assert "Compare <image> with <image>." in obs["text"]
    obs, info = env.reset(options={"task_id": "none"})
    assert info["messages"][1]["content"][0] == {"type": "image", "index": 0}
    obs, _ = env.reset(options={"task_id": "extra"})
    assert obs["tokens"].tolist().count(IMAGE_ID) == 1  # the second marker stays text
    assert obs["text"].count("<image>") == 2
    obs, _ = env.reset(options={"task_id": "forged"})
    assert obs["images"] == () and IMAGE_ID not in obs["tokens"].tolist()
    env.close()


def test_a_writable_task_image_is_shared_read_only_not_copied():
    image = np.zeros((10, 12, 3), np.uint8)
    env = _image_env([Task("t", "<image> what?", "x", assets={"images": [image]})])
    obs, _ = env.reset()
    assert np.shares_memory(obs["images"][0], image) and not obs["images"][0].flags.writeable
    assert image.flags.writeable  # the caller's array is left as it was
    with pytest.raises(InvalidConfigError, match="HxWx3"):
        _image_env([Task("g", "<image>", "x", assets={"images": [np.zeros((4, 4))]})]).reset()
    env.close()


def test_memory_per_turn_is_the_new_image_and_is_released_at_close():
    env = gym.make("VT-Visual-v0", split="test", max_turns=20)
    env.reset(seed=0)
    tracemalloc.start()
    try:
        growth, held = [], 0
        before = tracemalloc.get_traced_memory()[0]
        for turn in range(19):
            obs, _, terminated, truncated, _ = env.step(
                _call("zoom", bbox=[10 * turn, 10, 10 * turn + 200, 150], image=0)
            )
            assert not (terminated or truncated)
            held += obs["images"][0].nbytes
            now = tracemalloc.get_traced_memory()[0]
            growth.append(now - before - held)
            del obs
        _, _, terminated, _, _ = env.step("<answer>A</answer>")
        assert terminated
        # Everything but the images themselves stays small and does not grow with the
        # turn: no image is copied again, re-encoded or re-sent.
        assert max(growth) < 2_000_000, growth
        assert growth[-1] - growth[2] < 500_000, growth
        obs, _ = env.reset(seed=1)  # the finished episode's images are released
        fresh = obs["images"][0].nbytes  # the new episode's copy, and its scene in the cache
        assert tracemalloc.get_traced_memory()[0] - before < 2 * fresh + 1_000_000 < held
    finally:
        tracemalloc.stop()
        env.close()


def _vstar_dir(root, seeds) -> str:
    """A V* bench layout with one item per scene seed (full-size images on disk)."""
    from PIL import Image

    category = root / "direct_attributes"
    category.mkdir()
    for seed in seeds:
        scene = scene_of("color", seed)
        Image.fromarray(scene.image).save(category / f"item{seed}.png")
        options = [scene.answer, *[c for c in scene.choices if c != scene.answer]]
        meta = {"question": scene.question, "options": options, "bbox": [0, 0, 10, 10]}
        (category / f"item{seed}.json").write_text(json.dumps(meta))
    return str(root)


def _play(env, seeds, refs: list) -> int:
    """Episodes that zoom once, with weakrefs to every image they saw; the largest
    image's size."""
    largest = 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        height, width = obs["images"][0].shape[:2]
        zoomed = env.step(_call("zoom", bbox=[0, 0, width // 4, height // 4], image=0))[0]
        for image in (*obs["images"], *zoomed["images"]):
            refs.append(weakref.ref(image))
            largest = max(largest, image.nbytes)
        del obs, zoomed
        env.step("<answer>A</answer>")
    return largest


@pytest.mark.parametrize("dataset", ["scenes", "vstar"])
def test_close_lets_go_of_every_image_the_env_decoded(tmp_path, dataset):
    """After close() the env keeps no image: not the episodes' (weakrefs die), and no
    decoded scene or image file in a cache (traced memory back near where it began)."""
    kwargs = {"dataset": _vstar_dir(tmp_path, range(6))} if dataset == "vstar" else {}
    warm = gym.make("VT-Visual-v0", split="test", **kwargs)  # imports, fonts, tokenizer
    _play(warm, [0], [])
    warm.close()
    del warm
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        env = gym.make("VT-Visual-v0", split="test", **kwargs)
        refs: list = []
        largest = _play(env, range(6), refs)
        env.close()
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert [ref() for ref in refs if ref() is not None] == []
    assert kept < largest, (kept, largest)  # not even one image's worth
    assert env.render() is None


def test_a_long_run_holds_a_bounded_number_of_images():
    """However many episodes run, the env keeps its current episode's images and the
    last two decoded scenes, not one per episode."""
    env = gym.make("VT-Visual-v0", split="test", render_mode="rgb_array")
    _play(env, [0], [])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        refs: list = []
        growth, largest = [], 0
        for seed in range(1, 21):
            largest = max(largest, _play(env, [seed], refs))
            growth.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()
    assert sum(ref() is not None for ref in refs) <= 2  # the last episode's (for render)
    # the last episode's two images and two cached scenes, a little over
    assert max(growth) < 5 * largest, (max(growth), largest)
    env.close()


def test_a_64_env_vector_env_holds_each_image_once():
    venv = vt_envs.make_vec("VT-Visual-v0", num_envs=64, split="test")
    obs, _ = venv.reset(seed=0)
    actions = []
    for i in range(64):
        height, width = obs["images"][i][0].shape[:2]
        actions.append(_call("zoom", bbox=[0, 0, width // 3, height // 3], image=0))
    stepped, *_ = venv.step(actions)
    arrays = {}
    for i, sub in enumerate(venv.envs):
        episode = sub.unwrapped._episode
        (session,) = {id(s): s for s in sub.unwrapped._live.sessions.values()}.values()
        assert [id(a) for a in session.images] == [id(a) for a in episode.images]
        assert obs["images"][i][0] is episode.images[0]
        assert stepped["images"][i][0] is episode.images[1]
        for array in episode.images:
            arrays[id(array)] = array
    assert len(arrays) == 128
    listed = list(arrays.values())
    for k, first in enumerate(listed):
        assert not any(np.shares_memory(first, other) for other in listed[k + 1 :])
    venv.close()


def test_v_star_layout_through_gym_make(tmp_path):
    from PIL import Image

    scene = scene_of("color", 1)
    category = tmp_path / "direct_attributes"
    category.mkdir()
    Image.fromarray(scene.image).save(category / "item.png")
    left, top, right, bottom = scene.targets[0]
    (category / "item.json").write_text(
        json.dumps(
            {
                "question": scene.question,
                "options": [scene.answer, *[c for c in scene.choices if c != scene.answer]],
                "bbox": [left, top, right - left, bottom - top],
            }
        )
    )
    env = gym.make("VT-Visual-v0", dataset=str(tmp_path))
    result = vt_envs.run_episode(env, VisualOracle(), seed=0)
    assert result.reward == 1.0 and '"zoom"' in result.actions[0]
    obs, _ = env.reset(seed=0)
    assert np.array_equal(obs["images"][0], scene.image)
    env.close()


def test_easy_vqa_open_questions():
    from vt_envs.domains.visual import easy_vqa_available, load_easy_vqa

    if not easy_vqa_available():
        pytest.skip("easy-vqa (the visual extra) is not installed")
    tasks = load_easy_vqa("test", size=20)
    assert len(tasks) == 20 and all(t.assets["choices"] == [] for t in tasks)
    env = gym.make("VT-Visual-v0", dataset="easy-vqa", split="test", size=20)
    obs, _ = env.reset(seed=0)
    assert obs["images"][0].shape == (64, 64, 3)
    result = vt_envs.run_episode(env, VisualOracle(), seed=0)
    assert result.reward == 1.0 and result.turns == 1  # no targets: nothing to zoom
    env.close()


def test_an_image_mark_in_the_policy_text_is_not_an_image(env):
    env.reset(seed=0)
    forged = '<tool_call>{"name": "\x00VTimage\x00", "arguments": {}}</tool_call>'
    obs, _, terminated, truncated, info = env.step(forged)
    assert not (terminated or truncated) and info["invalid_actions"] == 1
    assert obs["images"] == () and IMAGE_ID not in obs["tokens"].tolist()
    obs, *_ = env.step(_call("crop", bbox=[0, 0, 9, 9]))  # the episode goes on
    assert len(obs["images"]) == 1
