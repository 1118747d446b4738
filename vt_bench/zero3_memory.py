"""Host memory per rank while ZeRO-3 loads a model: built partitioned or loaded whole.

Two CPU ranks (``torchrun``, gloo) load one model (a packaged model's name,
default SmolLM2-135M-Instruct in fp32; or a directory) as the trainer's
actor under ZeRO-3, three ways:

- ``sharded`` (``deepspeed.zero_init: true``, the default): built partitioned,
  filled one tensor at a time by rank 0 (:mod:`vt_train.sharded_load`);
- ``transformers``: ``from_pretrained`` under an ``HfDeepSpeedConfig`` (built
  partitioned, but every rank reads the whole checkpoint first);
- ``whole`` (``zero_init: false``): each rank loads the whole model (views of
  the memory-mapped file where no dtype conversion is needed), then DeepSpeed
  partitions it.

Reported per rank: the peak rise of anonymous resident memory from before
the load to the end of DeepSpeed's set-up (file pages of the memory-mapped
checkpoint are shared and not counted), and what stays after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "main", "render", "run_zero3_memory"]

MiB = 1 << 20
MODES = ("sharded", "transformers", "whole")


def _worker(model: str, mode: str, bf16: bool, out: Path) -> None:
    import torch

    from vt_bench.peak_memory import PeakMemory, anon_rss, release_free_memory
    from vt_train.config import load_config
    from vt_train.ds_engine import DeepSpeedModel, zero3_construction
    from vt_train.logprobs import LogprobModel
    from vt_train.trainer import _load_partitioned
    from vt_train.vision import load_policy

    torch.set_num_threads(1)
    train = load_config(
        None, [f"model.path={model}", "deepspeed.zero_stage=3", f"deepspeed.bf16={bf16}"]
    )
    dtype = torch.bfloat16 if bf16 else torch.float32
    base = anon_rss()
    with PeakMemory() as load:
        if mode == "sharded":
            policy = _load_partitioned(train)
        else:
            with zero3_construction(train.deepspeed) if mode == "transformers" else nullcontext():
                policy = load_policy(model, dtype=dtype)
    release_free_memory()
    loaded = anon_rss() - base
    with PeakMemory() as setup:
        actor = DeepSpeedModel(LogprobModel(policy), train.deepspeed, lr=1e-5)
    release_free_memory()
    rank = int(os.environ["RANK"])
    params = sum(getattr(p, "ds_numel", p.numel()) for p in actor.module.parameters())
    record = {
        "rank": rank, "load_peak_mb": load.rise / MiB, "loaded_mb": loaded / MiB,
        "setup_peak_mb": (loaded + setup.rise) / MiB, "after_mb": (anon_rss() - base) / MiB,
        "parameters": params,
    }  # fmt: skip
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def run_zero3_memory(model: str, ranks: int = 2, bf16: bool = False) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    modes: dict[str, list[dict[str, float]]] = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix="vt_zero3_memory_") as folder:
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={ranks}", "-m", "vt_bench.zero3_memory", "--worker",
                "--model", model, "--out", folder, "--mode", mode,
                *(["--bf16"] if bf16 else []),
            ]  # fmt: skip
            subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=1800)
            modes[mode] = [
                json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(ranks)
            ]
    return {"model": model, "ranks": ranks, "bf16": bf16, "modes": modes}


def render(report: dict[str, Any]) -> str:
    lines = [
        "| loading | rank | load peak (MB) | after the load (MB) | DeepSpeed set-up peak (MB) "
        "| after set-up (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, records in report["modes"].items():
        for r in records:
            lines.append(
                f"| {mode} | {r['rank']} | {r['load_peak_mb']:,.0f} | {r['loaded_mb']:,.0f} | "
                f"{r['setup_peak_mb']:,.0f} | {r['after_mb']:,.0f} |"
            )
    params = report["modes"][MODES[0]][0]["parameters"]
    dtype = "bf16" if report["bf16"] else "fp32"
    lines += [
        "",
        f"{report['model']} ({params / 1e6:.1f}M parameters) trained in {dtype} as the actor "
        f"under ZeRO-3 on {report['ranks']} CPU ranks (gloo): each rank's anonymous resident "
        "memory above its level before the load (a memory-mapped checkpoint's pages are "
        "shared and not counted; 'after' readings follow malloc_trim).",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m-instruct", help="name or directory")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="train (and load) in bf16")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default=MODES[0], help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.worker:
        _worker(args.model, args.mode, args.bf16, args.out)
        return 0
    report = run_zero3_memory(args.model, args.ranks, args.bf16)
    print(render(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "zero3_memory.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":  # torchrun's workers: python -m vt_bench.zero3_memory --worker
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
