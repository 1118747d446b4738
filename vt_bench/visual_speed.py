"""Visual speed: VT-Visual-v0 oracle steps/s, reset and image-tool latency, image tokens.

Measured in one run, on the held-out scenes (1024-1536 px a side):

- ``env``: steps/s of the oracle (one ``zoom`` into the targets, then the
  answer), ``--repeats`` runs of ``--episodes`` episodes on one env, resets
  included, as the median (and min/max). A scene is rendered when its task is
  first drawn (the first pass, ``first_reset_incl_render_ms``) and the last
  16 stay cached per process, so later passes time the env, not Pillow;
- ``reset`` / ``zoom``: p50/p99 of ``env.reset`` (copying the task's image,
  encoding the prompt) and of the zoom call as the env reports it
  (``info["tool"]["latency_s"]``), with the shipped tokenizer (one
  ``<image>`` id per image) and with a Qwen2-VL-style processor built
  locally (the processor's exact expansion: hundreds of pad ids per image);
- ``image_tokens``: the mean image tokens per episode with that processor.

Prints Markdown and writes ``visual_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vt_bench.stats import latency_summary

__all__ = ["add_arguments", "main", "render", "run_benchmark"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--episodes",
        type=int,
        default=16,
        help="oracle episodes per repeat (at most 16 scenes stay cached per process)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the episode series")
    parser.add_argument(
        "--max-pixels", type=int, default=1280 * 28 * 28, help="the processor's max_pixels"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def _series(episodes: int, repeats: int, **env_kwargs: Any) -> dict[str, Any]:
    import gymnasium as gym

    import vt_envs  # noqa: F401  (registers the ids)
    from vt_envs.domains.visual import VisualOracle

    env = gym.make("VT-Visual-v0", split="test", **env_kwargs)
    start = time.perf_counter()
    for e in range(episodes):  # the first pass renders the scenes; later passes reuse them
        env.reset(seed=e)
    render_s = (time.perf_counter() - start) / episodes
    rates, rewards, resets, zooms, image_tokens = [], [], [], [], []
    try:
        for _ in range(repeats):
            steps = 0
            began = time.perf_counter()
            for e in range(episodes):
                oracle = VisualOracle()
                t0 = time.perf_counter()
                obs, info = env.reset(seed=e)
                resets.append(time.perf_counter() - t0)
                oracle.reset(env.unwrapped.task)
                while True:
                    obs, reward, terminated, truncated, info = env.step(
                        oracle.act(obs["text"], info)
                    )
                    steps += 1
                    if "tool" in info:
                        zooms.append(info["tool"]["latency_s"])
                    if terminated or truncated:
                        break
                rewards.append(reward)
                image_tokens.append(info["episode_image_tokens"])
            rates.append(steps / (time.perf_counter() - began))
    finally:
        env.close()
    return {
        "steps_per_s_median": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "mean_reward": statistics.fmean(rewards),
        "first_reset_incl_render_ms": render_s * 1e3,
        "reset": latency_summary(resets),
        "zoom": latency_summary(zooms),
        "image_tokens_per_episode": statistics.fmean(image_tokens),
        "episodes_per_repeat": episodes,
        "repeats": repeats,
    }


def run_benchmark(episodes: int, repeats: int, max_pixels: int) -> dict[str, Any]:
    """Run both series (placeholder ids, processor expansion); the JSON-ready report."""
    from vt_envs.core.vl_processor import write_qwen_vl_processor

    placeholder = _series(episodes, repeats)
    with tempfile.TemporaryDirectory() as tmp:
        processor = write_qwen_vl_processor(Path(tmp) / "processor", max_pixels=max_pixels)
        expanded = _series(episodes, repeats, processor=str(processor), max_episode_tokens=1 << 15)
    return {
        "placeholder": placeholder,
        "processor": {**expanded, "max_pixels": max_pixels},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def render(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    rows = [
        "| image ids | oracle steps/s (median; min-max) | reset p50 / p99 (ms) "
        "| zoom p50 / p99 (ms) | image tokens / episode | mean reward |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, key in (("one `<image>` each", "placeholder"), ("Qwen2-VL processor", "processor")):
        r = report[key]
        rows.append(
            f"| {label} | **{r['steps_per_s_median']:.0f}** ({r['steps_per_s_min']:.0f}-"
            f"{r['steps_per_s_max']:.0f}) | {r['reset']['p50_ms']:.2f} / "
            f"{r['reset']['p99_ms']:.2f} | {r['zoom']['p50_ms']:.2f} / {r['zoom']['p99_ms']:.2f} "
            f"| {r['image_tokens_per_episode']:.0f} | {r['mean_reward']:.2f} |"
        )
    first = report["placeholder"]
    rows += [
        "",
        f"{first['repeats']} x {first['episodes_per_repeat']} held-out episodes (one zoom, then "
        f"the answer), resets included; a scene's first render "
        f"{first['first_reset_incl_render_ms']:.0f} ms (then cached); processor max_pixels "
        f"{report['processor']['max_pixels']:,}.",
    ]
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    report = run_benchmark(args.episodes, args.repeats, args.max_pixels)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "visual_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0
