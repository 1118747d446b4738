"""VT-Visual-v0: visual questions about large images, answered by cropping and zooming.

The observation carries images (``obs["images"]``): on reset the task's
image, on each step the images that step's tool calls made. The agent calls
image tools as JSON (``<tool_call>{"name": "zoom", "arguments": {"bbox":
[x1, y1, x2, y2], "image": 0}}</tool_call>``); each result is a new image
that later calls refer to by index; it answers with ``<answer>B</answer>``
(an option letter) or the answer text.

- :mod:`~vt_envs.domains.visual.config`: the keywords (:class:`VisualConfig`) and how
  the parts are built from them (:data:`VISUAL`);
- :mod:`~vt_envs.domains.visual.bbox`: the bbox conventions (``pixels``,
  ``normalized``, ``qwen1000``), stated in the system prompt, never guessed;
- :mod:`~vt_envs.domains.visual.ops`: the tools' image operations on
  read-only arrays (outputs capped in size; nothing written to disk);
- :mod:`~vt_envs.domains.visual.scenes`: procedural V*-style scenes with
  small targets and known answers;
- :mod:`~vt_envs.domains.visual.tools`: the image tools over an episode's
  image list (:class:`ImageStore`);
- :mod:`~vt_envs.domains.visual.tasks`: seeded scene tasks;
- :mod:`~vt_envs.domains.visual.verifier`: ``ChoiceMatch``;
- :mod:`~vt_envs.domains.visual.loaders`: V* bench and easy-VQA;
- :mod:`~vt_envs.domains.visual.oracle`: the zooming oracle and a no-tool baseline;
- :mod:`~vt_envs.domains.visual.shortcuts`: options-only policies (each picks by one
  statistic of the options' texts), the adversaries the choices hold at chance.

Image tokens (see :mod:`vt_envs.core.image_tokens`): one ``<image>`` id per
image with the shipped tokenizer, or a Qwen2-VL processor's exact expansion
with ``processor=PATH``.
"""

from __future__ import annotations

from vt_envs.domains.visual.bbox import BBOX_FORMATS, BoxError, describe_format
from vt_envs.domains.visual.config import INSTRUCTIONS, VISUAL, VisualConfig
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
from vt_envs.domains.visual.tasks import TaskImages, images_of_task, scene_of, visual_tasks
from vt_envs.domains.visual.tools import IMAGE_TOOLS, ImageSession, ImageStore, ImageTool
from vt_envs.domains.visual.verifier import ChoiceMatch
from vt_envs.tools.builder import domain_builder

__all__ = [
    "BBOX_FORMATS",
    "IMAGE_TOOLS",
    "INSTRUCTIONS",
    "SCENE_KINDS",
    "VISUAL",
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
    "VisualConfig",
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

make_visual_env = domain_builder(VISUAL, name="make_visual_env", module=__name__)
