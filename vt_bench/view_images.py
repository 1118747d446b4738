"""``vt-bench view --images``: an eval's images, rebuilt by replaying its rollouts.

An eval record keeps its transcript as text, each image a ``<image>``
placeholder (the pixels would make ``rollouts.jsonl`` hundreds of times
larger). The envs are deterministic given the task, the reset seed and the
actions, so the images come back by playing the record again: the env id is
built with the eval's ``config.json`` keywords, reset with the record's
``reset_seed`` and task, and stepped with its recorded actions; the task's
images and every tool result's (a zoom, a crop) are collected in order. A
replay that ends with another reward than the record's is dropped (the
rollout then shows its placeholders), so a page never shows images the
policy did not see. Only embedded rollouts of env ids whose transcripts hold
``<image>`` are replayed; images are scaled to ``side`` pixels on their long
side and embedded as JPEG data URLs.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["image_data_url", "replay_images"]


def replay_images(directory: Path, rollouts: Sequence[dict[str, Any]], *, side: int = 512) -> int:
    """Fill ``images`` of the rollouts that show ``<image>`` by replaying them; returns how
    many rollouts got their images. Failures are logged and skipped, never raised."""
    from vt_bench.evals.runner import make_env

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as exc:
        logger.warning("--images: no config.json in %s (%s); images not replayed", directory, exc)
        return 0
    by_env: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rollouts:
        seed = r["meta"].get("reset_seed")
        if "<image>" in r["transcript"] and not r["images"] and seed is not None and r["turns"]:
            by_env[r["env"]].append(r)
    done = 0
    for env_id, members in by_env.items():
        kwargs = {
            "split": config.get("split", "test"),
            **(config.get("env_kwargs") or {}),
            **((config.get("env_kwargs_by_id") or {}).get(env_id) or {}),
        }
        try:
            env = make_env(env_id, **kwargs)
        except Exception as exc:
            logger.warning("--images: cannot build %s (%s); its images not replayed", env_id, exc)
            continue
        try:
            for r in members:
                try:
                    images = _replay(env, r)
                except Exception as exc:
                    logger.warning("--images: %s %s: %s", env_id, r["task_id"], exc)
                    continue
                r["images"] = [image_data_url(image, side) for image in images]
                done += 1
        finally:
            env.close()
    return done


def _replay(env: Any, r: dict[str, Any]) -> list[Any]:
    obs, _ = env.reset(seed=int(r["meta"]["reset_seed"]), options={"task_id": r["task_id"]})
    images = list(obs.get("images", ()))
    reward = None
    for turn in r["turns"]:
        obs, reward, terminated, truncated, _ = env.step(str(turn.get("action") or ""))
        images += list(obs.get("images", ()))
        if terminated or truncated:
            break
    if r["reward"] is not None and (reward is None or abs(float(reward) - r["reward"]) > 1e-6):
        raise ValueError(f"the replay ended with reward {reward}, the record {r['reward']}")
    return images


def image_data_url(image: Any, side: int = 512, quality: int = 85) -> str:
    """An RGB(A) array (or PIL image) as a ``data:image/jpeg;base64,...`` URL, its long
    side at most ``side`` pixels (JPEG: a fifth of PNG's size on the scenes of VT-Visual-v0)."""
    from PIL import Image

    picture = image if isinstance(image, Image.Image) else Image.fromarray(image)
    picture = picture.convert("RGB")
    if side > 0 and max(picture.size) > side:
        picture.thumbnail((side, side))
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
