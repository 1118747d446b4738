"""Image tools of VT-Visual-v0: each call reads an image of the episode by index and adds one.

The episode's images live in its session (:class:`ImageSession`): index 0
(and up) are the task's images, and every successful call appends its
result, which later calls can reference. Images are held by reference
(read-only arrays), never copied or encoded. Every argument mistake — a box
outside the image or in the wrong convention, zero area, an unknown image
index, a non-numeric value — is a ``ToolResult.failure`` the agent reads.

Tools are JSON-only (``<tool_call>{"name": "crop", "arguments": {"bbox":
[x1, y1, x2, y2], "image": 0}}</tool_call>``); the box convention is the
env's ``bbox_format`` (see :mod:`~vt_envs.domains.visual.bbox`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vt_envs.core.tool import Tool, ToolResult
from vt_envs.domains.visual import ops
from vt_envs.domains.visual.bbox import BBOX_FORMATS, BoxError, to_pixels
from vt_envs.errors import InvalidConfigError

__all__ = [
    "IMAGE_TOOLS",
    "MAX_IMAGES",
    "ContrastTool",
    "CropTool",
    "FlipTool",
    "GrayscaleTool",
    "ImageSession",
    "ImageStore",
    "ImageTool",
    "RotateTool",
    "ZoomTool",
]

#: Images one episode may hold (task images included); past it, calls fail.
MAX_IMAGES = 32

_IMAGE_ARG = {
    "type": "integer",
    "description": "index of the image to use (0 = the task's image; default: the latest image)",
}


@dataclass
class ImageSession:
    """The images of one episode, in the order they appeared."""

    images: list[np.ndarray] = field(default_factory=list)
    closed: bool = False


class ImageStore:
    """The running episode's images of one env, shared by all its image tools.

    The env loads the task's images through :meth:`images` at reset: each
    episode gets its own read-only copy (0.3 ms for a 1.3-megapixel scene),
    so no two episodes' observations share an array, while within the
    episode the env, its observations and every image tool hold that one
    copy by reference. The env opens one session per tool; the first image
    tool to open creates the episode's :class:`ImageSession` from those
    images and the others join it, so a crop made with one tool can be
    zoomed with another. A closed session is never reused. One store serves
    one env (one episode at a time). When the env closes (its image tools'
    :meth:`~ImageTool.aclose`), :meth:`clear` drops every image the store
    holds, its ``task_images`` cache's too (a :class:`TaskImages`).
    """

    def __init__(self, task_images: Callable[[Any], Sequence[np.ndarray]]):
        self.task_images = task_images
        self._current: ImageSession | None = None
        self._task: Any = None
        self._loaded: tuple[Any, tuple[np.ndarray, ...]] | None = None

    def images(self, task: Any) -> tuple[np.ndarray, ...]:
        """Fresh read-only copies of ``task``'s images, for the episode that opens now
        (the env's ``task_images``)."""
        images = tuple(_own_copy(image) for image in self.task_images(task))
        self._loaded = (task, images)
        return images

    def session(self, task: Any) -> ImageSession:
        """The episode's session: made by the first tool to open, joined by the rest."""
        current = self._current
        if current is None or current.closed or self._task is not task:
            loaded = self._loaded
            images = loaded[1] if loaded is not None and loaded[0] is task else self.images(task)
            self._loaded = None  # taken: the next episode loads its own copy
            current = ImageSession(list(images))
            self._current, self._task = current, task
        return current

    def clear(self) -> None:
        """Drop the episode's images and the decoded task images (idempotent)."""
        if self._current is not None:
            self._current.closed = True
            self._current.images.clear()
        self._current = self._task = self._loaded = None
        clear = getattr(self.task_images, "clear", None)
        if callable(clear):
            clear()

    def tools(
        self, names: Sequence[str] | None = None, *, zoom_target: int = 672, **kwargs: Any
    ) -> list[ImageTool]:
        """The image tools (all of :data:`IMAGE_TOOLS`, or ``names``), bound to this store;
        ``kwargs`` (``bbox_format``, ``timeout_s``) go to each, ``zoom_target`` to ``zoom``."""
        chosen = list(IMAGE_TOOLS) if names is None else list(names)
        unknown = [n for n in chosen if n not in IMAGE_TOOLS]
        if unknown:
            raise InvalidConfigError(
                f"unknown image tools {unknown}; choose from {list(IMAGE_TOOLS)}"
            )
        tools = [
            IMAGE_TOOLS[name](**kwargs, **({"target": zoom_target} if name == "zoom" else {}))
            for name in chosen
        ]
        for tool in tools:
            tool.bind(self.session, release=self.clear)
        return tools


class ImageTool(Tool):
    """Base of the image tools: resolves ``image``, applies :meth:`apply`, appends the result.

    Subclasses set the schema and implement :meth:`apply`. The session is
    shared by every image tool of the env: the env opens one per tool, so the
    tools are given a common *provider* (:meth:`bind`) that maps a task to
    its session.
    """

    concurrent_calls = False
    bbox_format: str = "pixels"

    def __init__(self, *, bbox_format: str = "pixels", timeout_s: float = 10.0):
        super().__init__(timeout_s=timeout_s)
        if bbox_format not in BBOX_FORMATS:
            raise InvalidConfigError(
                f"bbox_format must be one of {BBOX_FORMATS}, got {bbox_format!r}"
            )
        self.bbox_format = bbox_format
        self._sessions: Callable[[Any], ImageSession] | None = None
        self._release: Callable[[], None] | None = None

    def bind(
        self, sessions: Callable[[Any], ImageSession], release: Callable[[], None] | None = None
    ) -> None:
        """Use ``sessions(task)`` as this tool's session (the env's shared image list);
        ``release()`` runs when the env closes the tool (:meth:`aclose`)."""
        self._sessions, self._release = sessions, release

    async def aclose(self) -> None:
        """The env closes: the shared store lets go of every image it holds."""
        if self._release is not None:
            self._release()

    async def open_session(self, task: Any, *, seed: int) -> ImageSession:
        if self._sessions is None:
            raise InvalidConfigError(f"{type(self).__name__} is not bound to an image store")
        return self._sessions(task)

    async def close_session(self, session: ImageSession) -> None:
        session.closed = True
        session.images.clear()

    def _image(self, session: ImageSession, arguments: Mapping[str, Any]) -> np.ndarray:
        index = arguments.get("image", len(session.images) - 1 if session.images else 0)
        if isinstance(index, bool) or not isinstance(index, int):
            raise BoxError(f"image must be an integer index, got {index!r}")
        if not session.images:
            raise BoxError("this task has no image: the image tools have nothing to work on")
        if not 0 <= index < len(session.images):
            raise BoxError(
                f"there is no image {index}: this episode has images 0 to {len(session.images) - 1}"
            )
        return session.images[index]

    def _box(self, image: np.ndarray, box: Any) -> tuple[int, int, int, int]:
        height, width = image.shape[:2]
        return to_pixels(box, self.bbox_format, width, height)

    async def call(
        self, session: ImageSession, arguments: Mapping[str, Any], *, timeout_s: float
    ) -> ToolResult:
        if session is None or session.closed:
            return ToolResult.failure("Error: this episode's images are closed.", "closed")
        if len(session.images) >= MAX_IMAGES:
            return ToolResult.failure(
                f"Error: this episode already holds {MAX_IMAGES} images; answer with those.",
                "too_many_images",
            )
        try:
            source = self._image(session, arguments)
            result = self.apply(source, arguments)
        except BoxError as exc:
            return ToolResult.failure(f"Error: {exc}", "bad_arguments")
        session.images.append(result)
        index = len(session.images) - 1
        height, width = result.shape[:2]
        return ToolResult(
            f"Image {index}: {width}x{height} pixels.",
            images=(result,),
            metrics={"width": width, "height": height},
        )

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        raise NotImplementedError


def _own_copy(image: np.ndarray) -> np.ndarray:
    fresh = np.array(image, dtype=np.uint8, order="C")
    fresh.setflags(write=False)
    return fresh


def _schema(properties: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**properties, "image": _IMAGE_ARG},
        "required": list(required),
        "additionalProperties": False,
    }


_BBOX = {"type": "array", "description": "[x1, y1, x2, y2] in the env's bbox convention"}


class CropTool(ImageTool):
    name = "crop"
    description = "Crop a region of an image; the crop becomes a new image."
    parameters: ClassVar[dict[str, Any]] = _schema({"bbox": _BBOX}, ["bbox"])

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        return ops.crop(image, self._box(image, arguments["bbox"]))


class ZoomTool(ImageTool):
    name = "zoom"
    description = "Crop a region and enlarge it (long side 672 px) to see small details."
    parameters: ClassVar[dict[str, Any]] = _schema({"bbox": _BBOX}, ["bbox"])

    def __init__(self, *, target: int = 672, **kwargs: Any):
        super().__init__(**kwargs)
        if isinstance(target, bool) or not isinstance(target, int) or not 28 <= target <= 2048:
            raise InvalidConfigError(f"zoom target must be an int in [28, 2048], got {target!r}")
        self.target = target
        self.description = (
            f"Crop a region and enlarge it (long side {target} px) to see small details."
        )

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        return ops.zoom(image, self._box(image, arguments["bbox"]), target=self.target)


class RotateTool(ImageTool):
    name = "rotate"
    description = "Rotate an image counter-clockwise by DEGREES."
    parameters: ClassVar[dict[str, Any]] = _schema({"degrees": {"type": "number"}}, ["degrees"])

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        degrees = arguments["degrees"]
        if not np.isfinite(degrees):
            raise BoxError(f"degrees must be a finite number, got {degrees!r}")
        return ops.rotate(image, float(degrees))


class FlipTool(ImageTool):
    name = "flip"
    description = "Mirror an image horizontally or vertically."
    parameters: ClassVar[dict[str, Any]] = _schema(
        {"direction": {"type": "string", "enum": ["horizontal", "vertical"]}}, ["direction"]
    )

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        return ops.flip(image, arguments["direction"])


class GrayscaleTool(ImageTool):
    name = "grayscale"
    description = "Convert an image to grayscale."
    parameters: ClassVar[dict[str, Any]] = _schema({}, [])

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        return ops.grayscale(image)


class ContrastTool(ImageTool):
    name = "contrast"
    description = "Change an image's contrast by FACTOR (1 = unchanged, 2 = twice, 0.5 = half)."
    parameters: ClassVar[dict[str, Any]] = _schema({"factor": {"type": "number"}}, ["factor"])

    def apply(self, image: np.ndarray, arguments: Mapping[str, Any]) -> np.ndarray:
        factor = arguments["factor"]
        if not np.isfinite(factor) or not 0 <= factor <= 10:
            raise BoxError(f"factor must be between 0 and 10, got {factor!r}")
        return ops.adjust_contrast(image, float(factor))


#: The image tools by name.
IMAGE_TOOLS: dict[str, type[ImageTool]] = {
    tool.name: tool
    for tool in (CropTool, ZoomTool, RotateTool, FlipTool, GrayscaleTool, ContrastTool)
}
