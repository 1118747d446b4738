"""What a rollout produces: one :class:`Trajectory` per (task, sample).

Token-level lists are aligned to ``input_ids``: index ``t`` describes token
``t``. ``loss_mask[t]`` is 1 exactly on tokens the policy generated, 0 on the
prompt, observations and any boundary tokens the env inserted;
``rollout_logprobs[t]`` is the engine's ``log p(token t | tokens < t)`` where
``loss_mask[t]`` is 1, and 0.0 elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Trajectory"]


@dataclass
class Trajectory:
    """One episode, as the trainer consumes it.

    Attributes:
        task_id: the env task this trajectory solved (or not).
        group_id: trajectories sampled for the same task in one rollout step
            share it (GRPO / RLOO groups).
        input_ids: prompt + (action + observation)* ids, exactly as the policy
            saw and generated them.
        loss_mask: 1 on policy-generated tokens, else 0.
        rollout_logprobs: the engine's logprobs on generated tokens, else 0.0.
        prompt_length: number of prompt tokens (the first observation).
        reward: the episode's total reward (final-step reward).
        reward_parts: ``info["reward_parts"]`` of the final step.
        terminated / truncated: how the episode ended.
        turns, tool_calls, tool_errors, invalid_actions: episode statistics.
        finish_reasons: each turn's generation finish reason.
        actions: each turn's generated text (for transcripts).
        images: the images the policy saw, in the order their tokens appear in
            ``input_ids`` (read-only ``HxWx3 uint8`` arrays, held by reference:
            the env's own, never copied).
        image_spans: ``(start, end)`` of each image's ids in ``input_ids``
            (``input_ids[start:end]``: ``<image>``, or vision start, pads, end).
    """

    task_id: str
    group_id: int
    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    prompt_length: int
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    invalid_actions: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)
    image_spans: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(
                f"trajectory {self.task_id}: input_ids ({n}), loss_mask ({len(self.loss_mask)}) "
                f"and rollout_logprobs ({len(self.rollout_logprobs)}) must have equal lengths"
            )
        if self.image_spans and len(self.image_spans) != len(self.images):
            raise ValueError(
                f"trajectory {self.task_id}: {len(self.images)} images but "
                f"{len(self.image_spans)} image spans; they must pair up"
            )

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)
