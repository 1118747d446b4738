"""What a vision-language policy needs besides token ids: pixels, grids and 3-D positions.

A Qwen2-VL / Qwen2.5-VL policy reads each image twice: as the image-pad ids
the env put in the token sequence (``<|vision_start|>``, N x
``<|image_pad|>``, ``<|vision_end|>``), and as ``pixel_values`` the vision
tower turns into N embeddings that replace those ids. Its rotary positions
are 3-D (time, height, width) over image tokens. Both engines and the
trainer build them here, the same way:

- :class:`ImageInputs` runs the processor's own image processor
  (``Qwen2VLImageProcessor``, read from the processor directory) on the
  images of a batch, in order, giving ``pixel_values`` and
  ``image_grid_thw``;
- :func:`rope_positions` asks the model for its positions
  (``get_rope_index``), never re-deriving them;
- :func:`trunk_hidden` runs the model's trunk on ids + pixels (or ids alone
  for a text model), which is what :class:`~vt_train.logprobs.LogprobModel`,
  the critic and the HF engine call.

Images travel by reference (read-only ``HxWx3 uint8`` arrays) from
``obs["images"]`` through :class:`~vt_train.trajectory.Trajectory` and
:class:`~vt_train.batch.TrainBatch`; pixel values are computed when a forward
needs them and dropped after it, so a batch never holds an image twice.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vt_envs.core.packaged_models import resolve_model
from vt_envs.errors import InvalidConfigError

__all__ = [
    "ImageInputs",
    "ImageInterner",
    "is_vision_language",
    "load_policy",
    "rope_positions",
    "trunk_hidden",
    "vision_token_ids",
]


def is_vision_language(model: Any) -> bool:
    """Whether ``model`` (a causal LM, or a wrapper with ``.lm``) has a vision tower."""
    lm = getattr(model, "lm", model)
    config = getattr(lm, "config", None)
    return getattr(config, "vision_config", None) is not None


def vision_token_ids(config: Any) -> tuple[int, ...]:
    """The ids only the env may place (image pads, video pads, vision start / end): a
    policy that sampled one would break the image-token count, so engines ban them."""
    names = ("vision_start_token_id", "image_token_id", "vision_end_token_id", "video_token_id")
    return tuple(int(v) for n in names if (v := getattr(config, n, None)) is not None)


class ImageInputs:
    """A processor's image processor: images → ``pixel_values`` and ``image_grid_thw``.

    Args:
        processor: a processor directory (its ``preprocessor_config.json``) or a
            ``transformers`` image processor object.
    """

    def __init__(self, processor: str | os.PathLike[str] | Any):
        if isinstance(processor, (str, os.PathLike)):
            self.image_processor = _load_image_processor(str(processor))
        else:
            self.image_processor = getattr(processor, "image_processor", processor)

    def tokens(self, image: np.ndarray) -> int:
        """The image-pad ids ``image`` fills (its patches over the merge factor squared)."""
        height, width = image.shape[:2]
        patches = self.image_processor.get_number_of_image_patches(height, width, {})
        return patches // self.image_processor.merge_size**2

    def check_prompt(
        self, prompt: Sequence[int], images: Sequence[np.ndarray], pad_id: int
    ) -> None:
        """Raise :class:`InvalidConfigError` unless ``prompt``'s image-pad ids are exactly
        what ``images`` fill (a mismatch would fail deep in the model's forward)."""
        have = sum(1 for token in prompt if token == pad_id)
        want = sum(self.tokens(image) for image in images)
        if have != want:
            raise InvalidConfigError(
                f"the prompt holds {have} image-pad ids but its {len(images)} image(s) fill "
                f"{want}: give the images in order with ids from an env made with this "
                "policy's processor (processor=DIR), and never sample image-pad ids"
            )

    def __call__(
        self, images: Sequence[np.ndarray], device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """``{"pixel_values": [patches, C*T*P*P], "image_grid_thw": [n, 3]}`` for ``images``
        (in order); an empty dict for no images."""
        if not images:
            return {}
        out = self.image_processor(images=list(images), return_tensors="pt")
        return {
            "pixel_values": out["pixel_values"].to(device),
            "image_grid_thw": out["image_grid_thw"].to(device),
        }


@functools.lru_cache(maxsize=8)
def _load_image_processor(path: str) -> Any:
    config = Path(path) / "preprocessor_config.json"
    if not config.is_file():
        raise InvalidConfigError(
            f"{path!r} has no preprocessor_config.json; a vision-language policy needs its "
            "processor directory (write one with vt_envs.core.vl_processor."
            "write_qwen_vl_processor, or point at the model's own)"
        )
    kind = json.loads(config.read_text()).get("image_processor_type", "Qwen2VLImageProcessor")
    import transformers

    # Without torchvision, transformers 5 offers the PIL backends under a "Pil" suffix.
    cls = getattr(transformers, kind + "Pil", None) or getattr(transformers, kind)
    return cls.from_pretrained(path, local_files_only=True)


class ImageInterner:
    """Keeps one array per distinct image, so trajectories that saw equal images share it.

    An env gives each episode its own copy of the task's image (Gymnasium's
    checker wants no array shared between two resets), so the ``n`` samples of
    one GRPO group would hold ``n`` equal copies. The rollout collector passes
    every observed image through :meth:`intern`: an image equal to one already
    kept (same shape, same bytes) is replaced by the kept array, and the
    episode's copy is freed when its env resets. Lookup is by a fingerprint of
    the shape and 4,096 evenly spaced bytes; a hit is confirmed byte for byte,
    so two different images are never merged.
    """

    _SAMPLES = 4096

    def __init__(self) -> None:
        self._kept: dict[tuple, list[np.ndarray]] = {}
        self.hits = 0

    def intern(self, image: np.ndarray) -> np.ndarray:
        flat = image.reshape(-1)
        step = max(1, flat.size // self._SAMPLES)
        key = (image.shape, image.dtype.str, flat[::step].tobytes())
        bucket = self._kept.setdefault(key, [])
        for kept in bucket:
            if kept is image or np.array_equal(kept, image):
                self.hits += kept is not image
                return kept
        bucket.append(image)
        return image


def _base(lm: nn.Module) -> nn.Module:
    """The multimodal trunk of a VL causal LM (``Qwen2VLModel``: vision tower + decoder)."""
    return lm.model if hasattr(lm, "model") and hasattr(lm.model, "visual") else lm


def rope_positions(
    trunk: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> torch.Tensor:
    """The model's 3-D rotary positions ``[3, B, L]`` for a (padded) batch, from its own
    ``get_rope_index``: image tokens get (time, row, column) positions, text tokens one
    position repeated three times, padding 0."""
    config = trunk.config
    image_token = config.image_token_id
    video_token = getattr(config, "video_token_id", None)
    types = (input_ids == image_token).int()
    if video_token is not None:
        types = types + 2 * (input_ids == video_token).int()
    positions, _ = trunk.get_rope_index(
        input_ids,
        mm_token_type_ids=types,
        image_grid_thw=image_grid_thw,
        video_grid_thw=None,
        attention_mask=attention_mask,
    )
    return positions


def trunk_hidden(
    lm: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
) -> torch.Tensor:
    """The last hidden states ``[B, L, H]`` of ``lm``'s trunk (no KV cache).

    For a vision-language model: the image embeddings replace the image-pad ids and the
    positions are the model's 3-D ones; for a text model, the decoder on the ids."""
    if not is_vision_language(lm):
        if pixel_values is not None:
            raise InvalidConfigError(
                f"{type(lm).__name__} is a text model but the batch holds images; train a "
                "vision-language policy (model.vision or a Qwen2-VL model.path)"
            )
        decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else lm
        return decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
    trunk = _base(lm)
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    return trunk(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=rope_positions(trunk, input_ids, mask, image_grid_thw),
        pixel_values=pixel_values,
        image_grid_thw=image_grid_thw,
        use_cache=False,
    ).last_hidden_state


def load_policy(path: str | os.PathLike[str], **kwargs: Any) -> nn.Module:
    """A local model directory (or a packaged model's name, built once:
    :mod:`vt_envs.core.packaged_models`) as a causal LM: ``AutoModelForCausalLM``, or
    ``AutoModelForImageTextToText`` when its config has a vision tower (Qwen2-VL).
    A text model's SDPA attention is :mod:`vt_train.attention`'s (grouped heads
    without copies on the CPU; the same values)."""
    import transformers

    dtype = kwargs.get("dtype")
    path = resolve_model(path, dtype="bfloat16" if dtype == torch.bfloat16 else "float32")

    config = json.loads((Path(path) / "config.json").read_text())
    auto = (
        transformers.AutoModelForImageTextToText
        if "vision_config" in config
        else transformers.AutoModelForCausalLM
    )
    model = auto.from_pretrained(str(path), local_files_only=True, **kwargs)
    if "vision_config" in config:
        return model
    from vt_train.attention import use_cpu_gqa_attention

    return use_cpu_gqa_attention(model)
