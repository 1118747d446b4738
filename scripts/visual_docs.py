"""Write docs/envs/visual.md's VT-Visual-v0 example: a scene and the oracle's zoomed view.

Usage (from the repository root)::

    python scripts/visual_docs.py [--out docs] [--seed 6]

Runs one held-out ``label`` episode through ``gym.make("VT-Visual-v0")``
with the oracle, and saves the task's image (downscaled to 640 px wide, as a
policy at a small input budget would see it, with the zoomed region
outlined) and the image the zoom call returned, at full size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import gymnasium as gym  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

import vt_envs  # noqa: E402
from vt_envs.domains.visual import VisualOracle, bbox  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--seed", type=int, default=6)
    args = parser.parse_args()

    env = gym.make("VT-Visual-v0", split="test", kinds=["label"])
    result = vt_envs.run_episode(env, VisualOracle(), seed=args.seed)
    obs, _ = env.reset(seed=args.seed)
    scene = obs["images"][0]
    zoom_obs, *_ = env.step(result.actions[0])
    zoomed = zoom_obs["images"][0]
    env.close()

    height, width = scene.shape[:2]
    call = json.loads(result.actions[0].removeprefix("<tool_call>").removesuffix("</tool_call>"))
    box = bbox.to_pixels(call["arguments"]["bbox"], "pixels", width, height)
    whole = Image.fromarray(scene)
    ImageDraw.Draw(whole).rectangle(box, outline=(255, 0, 0), width=4)
    small = whole.resize((640, round(640 * height / width)), Image.Resampling.LANCZOS)
    args.out.mkdir(parents=True, exist_ok=True)
    small.save(args.out / "visual_scene.png", optimize=True)
    Image.fromarray(zoomed).save(args.out / "visual_zoom.png", optimize=True)
    print(f"reward {result.reward}; actions {result.actions}")
    print(f"wrote {args.out / 'visual_scene.png'} and {args.out / 'visual_zoom.png'}")


if __name__ == "__main__":
    main()
