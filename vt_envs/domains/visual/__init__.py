"""VT-Visual-v0: visual questions about large images, answered by cropping and zooming.

The observation carries images (``obs["images"]``): on reset the task's
image, on each step the images that step's tool calls made. The agent calls
image tools as JSON (``<tool_call>{"name": "zoom", "arguments": {"bbox":
[x1, y1, x2, y2], "image": 0}}</tool_call>``); each result is a new image
that later calls refer to by index; it answers with ``<answer>B</answer>``
(an option letter) or the answer text.

- :mod:`~vt_envs.domains.visual.bbox`: the bbox conventions (``pixels``,
  ``normalized``, ``qwen1000``), stated in the system prompt, never guessed;
- :mod:`~vt_envs.domains.visual.ops`: the tools' image operations on
  read-only arrays (outputs capped in size; nothing written to disk);
- :mod:`~vt_envs.domains.visual.scenes`: procedural V*-style scenes with
  small targets and known answers;
- :mod:`~vt_envs.domains.visual.tools`: the image tools over an episode's
  image list (:class:`ImageStore`);
- :mod:`~vt_envs.domains.visual.tasks`: seeded scene tasks and ``ChoiceMatch``;
- :mod:`~vt_envs.domains.visual.loaders`: V* bench and easy-VQA;
- :mod:`~vt_envs.domains.visual.oracle`: the zooming oracle and a no-tool baseline;
- :mod:`~vt_envs.domains.visual.shortcuts`: options-only policies (each picks by one
  statistic of the options' texts), the adversaries the choices hold at chance.

Image tokens (see :mod:`vt_envs.core.image_tokens`): one ``<image>`` id per
image with the shipped tokenizer, or a Qwen2-VL processor's exact expansion
with ``processor=PATH``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from vt_envs.core.env import ToolEnv
from vt_envs.core.task import TaskSource
from vt_envs.domains.visual.bbox import BBOX_FORMATS, BoxError, describe_format
from vt_envs.domains.visual.loaders import easy_vqa_available, load_easy_vqa, load_vstar
from vt_envs.domains.visual.oracle import NoToolPolicy, VisualOracle, stated_bbox_format
from vt_envs.domains.visual.scenes import (
    SCENE_KINDS,
    Scene,
    SceneSpec,
    describe_scene,
    render_scene,
)
from vt_envs.domains.visual.shortcuts import ShortcutPolicy, fit_shortcut
from vt_envs.domains.visual.tasks import (
    ChoiceMatch,
    TaskImages,
    images_of_task,
    scene_of,
    visual_tasks,
)
from vt_envs.domains.visual.tools import IMAGE_TOOLS, ImageSession, ImageStore, ImageTool
from vt_envs.errors import InvalidConfigError
from vt_envs.tools.builder import env_builder

__all__ = [
    "BBOX_FORMATS",
    "IMAGE_TOOLS",
    "INSTRUCTIONS",
    "SCENE_KINDS",
    "BoxError",
    "ChoiceMatch",
    "ImageSession",
    "ImageStore",
    "ImageTool",
    "NoToolPolicy",
    "Scene",
    "SceneSpec",
    "ShortcutPolicy",
    "TaskImages",
    "VisualOracle",
    "describe_format",
    "describe_scene",
    "easy_vqa_available",
    "fit_shortcut",
    "images_of_task",
    "load_easy_vqa",
    "load_vstar",
    "make_visual_env",
    "render_scene",
    "scene_of",
    "stated_bbox_format",
    "visual_tasks",
]

INSTRUCTIONS = (
    "Answer the question about the image. Small details are often unreadable at the "
    "resolution you see the whole image in: crop or zoom into the region that matters "
    "first. Each tool result is a new image, numbered in order (the task's image is image "
    '0), that later calls can refer to with "image". {bbox}'
)


def _tasks(dataset: str | os.PathLike[str] | None, split: str, **generated: Any) -> TaskSource:
    if dataset is None:
        return visual_tasks(split, **generated)
    if dataset == "easy-vqa":
        return load_easy_vqa(split, size=generated.get("size"))
    if os.path.isdir(dataset):
        return load_vstar(dataset, split=split)
    raise InvalidConfigError(
        f"dataset must be None (generated scenes), 'easy-vqa' or the directory of a V* bench "
        f"layout, got {dataset!r}"
    )


@env_builder(fixed={"action_format": ("json", "its tools take several arguments: JSON tool calls")})
def make_visual_env(
    *,
    split: str = "train",
    bbox_format: str = "pixels",
    kinds: Sequence[str] = SCENE_KINDS,
    size: int | None = None,
    multiple_choice: bool = True,
    dataset: str | os.PathLike[str] | None = None,
    tools: Sequence[str] | None = None,
    zoom_target: int = 672,
    tool_timeout_s: float = 10.0,
    max_turns: int = 6,
    max_episode_tokens: int = 8192,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build VT-Visual-v0.

    Args:
        split: ``"train"`` or ``"test"`` (the fixed held-out scenes).
        bbox_format: ``"pixels"`` (default), ``"normalized"`` or ``"qwen1000"``;
            stated in the system prompt; a box outside it is an error observation.
        kinds, size, multiple_choice: which generated scene kinds, at most how
            many tasks, and the multiple-choice (letter) or open (text) form.
        dataset: instead of generated scenes, ``"easy-vqa"`` or a V* bench directory.
        tools: the image tools offered (default: all of :data:`IMAGE_TOOLS`).
        zoom_target: the long side, in pixels, that ``zoom`` enlarges a region to.
        tool_timeout_s: deadline of one image operation.
        max_turns, max_episode_tokens, **env_kwargs: passed to :class:`ToolEnv`
            (``processor=PATH`` for a Qwen2-VL processor's image tokens,
            ``max_image_tokens`` for an image-token budget).
    """
    if bbox_format not in BBOX_FORMATS:
        raise InvalidConfigError(f"bbox_format must be one of {BBOX_FORMATS}, got {bbox_format!r}")
    # The env's decoded images: the last two kept (an episode's, and the one before it,
    # so reopening a task renders nothing), dropped at close() by the image tools.
    images = TaskImages(size=2)
    store = ImageStore(images)
    image_tools = store.tools(
        tools, bbox_format=bbox_format, timeout_s=tool_timeout_s, zoom_target=zoom_target
    )
    tasks = _tasks(dataset, split, kinds=kinds, size=size, multiple_choice=multiple_choice)
    return ToolEnv(
        tools=image_tools,
        tasks=tasks,
        verifier=ChoiceMatch(),
        instructions=INSTRUCTIONS.format(bbox=describe_format(bbox_format)),
        action_format="json",
        task_images=store.images,
        max_turns=max_turns,
        max_episode_tokens=max_episode_tokens,
        name="VT-Visual-v0",
        **env_kwargs,
    )
