"""VT-Visual-v0 declared: its keywords (:class:`VisualConfig`) and how its parts are built."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vt_envs.core.domain import Domain
from vt_envs.core.task import TaskSource
from vt_envs.domains.visual.bbox import BBOX_FORMATS, describe_format
from vt_envs.domains.visual.loaders import load_easy_vqa, load_vstar
from vt_envs.domains.visual.scenes import SCENE_KINDS
from vt_envs.domains.visual.tasks import TaskImages, visual_tasks
from vt_envs.domains.visual.tools import ImageStore, ImageTool
from vt_envs.domains.visual.verifier import ChoiceMatch
from vt_envs.errors import InvalidConfigError

__all__ = ["INSTRUCTIONS", "VISUAL", "VisualConfig", "instructions"]

INSTRUCTIONS = (
    "Answer the question about the image. Small details are often unreadable at the "
    "resolution you see the whole image in: crop or zoom into the region that matters "
    "first. Each tool result is a new image, numbered in order (the task's image is image "
    '0), that later calls can refer to with "image". {bbox}'
)


@dataclass(frozen=True)
class VisualConfig:
    """VT-Visual-v0's own keywords.

    ``processor=PATH`` (a Qwen2-VL processor's image tokens) and ``max_image_tokens``
    (an image-token budget) are :class:`ToolEnv`'s.

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
    """

    split: str = "train"
    bbox_format: str = "pixels"
    kinds: Sequence[str] = SCENE_KINDS
    size: int | None = None
    multiple_choice: bool = True
    dataset: str | os.PathLike[str] | None = None
    tools: Sequence[str] | None = None
    zoom_target: int = 672
    tool_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.bbox_format not in BBOX_FORMATS:
            raise InvalidConfigError(
                f"bbox_format must be one of {BBOX_FORMATS}, got {self.bbox_format!r}"
            )
        dataset = self.dataset
        if not (dataset is None or dataset == "easy-vqa" or os.path.isdir(dataset)):
            raise InvalidConfigError(
                f"dataset must be None (generated scenes), 'easy-vqa' or the directory of a V* "
                f"bench layout, got {dataset!r}"
            )

    @functools.cached_property
    def image_store(self) -> ImageStore:
        """The one :class:`ImageStore` of the env built from these keywords (once per
        config): its image tools and its ``task_images`` share it. It decodes through a
        :class:`TaskImages` keeping the last two (an episode's, and the one before it,
        so reopening a task renders nothing), dropped at ``close()`` by the image tools."""
        return ImageStore(TaskImages(size=2))


def tools(config: VisualConfig) -> list[ImageTool]:
    """The image tools (``tools=``: which), in the config's bbox convention."""
    return config.image_store.tools(
        config.tools,
        bbox_format=config.bbox_format,
        timeout_s=config.tool_timeout_s,
        zoom_target=config.zoom_target,
    )


def tasks(config: VisualConfig) -> TaskSource:
    """Generated scenes, or easy-VQA, or a V* bench directory (``dataset=``)."""
    if config.dataset is None:
        return visual_tasks(
            config.split,
            kinds=config.kinds,
            size=config.size,
            multiple_choice=config.multiple_choice,
        )
    if config.dataset == "easy-vqa":
        return load_easy_vqa(config.split, size=config.size)
    return load_vstar(config.dataset, split=config.split)


def verifier(config: VisualConfig) -> ChoiceMatch:
    """An option letter (or its text), or the open answer, against the gold."""
    return ChoiceMatch()


def instructions(config: VisualConfig) -> str:
    """The system prompt's task description, stating the config's bbox convention."""
    return INSTRUCTIONS.format(bbox=describe_format(config.bbox_format))


def env_kwargs(config: VisualConfig) -> dict[str, Any]:
    """The task images, loaded through the image tools' store."""
    return {"task_images": config.image_store.images}


VISUAL: Domain[VisualConfig] = Domain(
    id="VT-Visual-v0",
    config=VisualConfig,
    tools=tools,
    tasks=tasks,
    verifier=verifier,
    instructions=instructions,
    episode={"max_turns": 6, "max_episode_tokens": 8192},
    env_kwargs=env_kwargs,
    fixed={"action_format": ("json", "its tools take several arguments: JSON tool calls")},
)
