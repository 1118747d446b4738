"""Scripted policies of VT-Visual-v0: the zooming oracle and a no-tool baseline.

:class:`VisualOracle` zooms into the task's known target boxes through the
``zoom`` tool, in the bbox convention the system prompt states (it reads the
convention from the prompt, as an agent must), and answers the gold only
once the zoom succeeded. A reward of 1.0 therefore proves that the prompt
states the convention, the box converts to the right pixels, the tool
call parses and the verifier accepts the answer.

:class:`NoToolPolicy` answers at once without looking closer: always the
first option (chance level on multiple choice), the baseline a zooming agent
must beat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vt_envs.core.policy import OraclePolicy, Policy
from vt_envs.core.task import Task
from vt_envs.domains.visual.bbox import BBOX_FORMATS, describe_format, from_pixels, union_box

__all__ = ["ZOOM_MARGIN", "NoToolPolicy", "VisualOracle", "stated_bbox_format"]

#: Pixels the oracle keeps around the targets' union box.
ZOOM_MARGIN = 24


def stated_bbox_format(prompt: str) -> str | None:
    """The bbox convention a system prompt states (``None`` if it states none)."""
    found = [fmt for fmt in BBOX_FORMATS if describe_format(fmt) in prompt]
    return found[0] if len(found) == 1 else None


class VisualOracle(OraclePolicy):
    """Zooms into the union of the task's target boxes, then answers the gold."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.bbox_format: str | None = None

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        targets = self.task.assets.get("targets") or ()
        if self.turn == 0:
            self.bbox_format = stated_bbox_format(observation)
            if targets and self.bbox_format is not None:
                width, height = self.task.assets["image_size"]
                box = union_box(targets, width, height, ZOOM_MARGIN)
                bbox = from_pixels(box, self.bbox_format, width, height)
                call = {"name": "zoom", "arguments": {"bbox": bbox, "image": 0}}
                return f"<tool_call>{json.dumps(call)}</tool_call>"
            if targets:  # the prompt names no convention: say so rather than guess
                return "<answer>the bbox convention is not stated</answer>"
        elif targets and "Image 1:" not in observation:
            return "<answer>the zoom failed</answer>"
        return f"<answer>{self.task.gold}</answer>"


class NoToolPolicy(Policy):
    """Answers at once: option (A) on multiple choice, ``unknown`` on open questions."""

    def reset(self, task: Task) -> None:
        self.multiple_choice = bool(task.assets.get("choices"))

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        return "<answer>A</answer>" if self.multiple_choice else "<answer>unknown</answer>"
