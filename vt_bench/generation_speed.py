"""Generation speed: the HF rollout engine vs ``model.generate`` on the same tiny model.

Both sides sample ``--batch`` rows of ``--new-tokens`` tokens at temperature
1 from the same randomly initialized tiny Qwen2 policy and the same prompts
(left-padded for ``generate``), in one process, alternating rounds; the
medians of generated tokens per second are reported, with their ratio. The
engine serves the rows as concurrent seeded requests (its continuous batching
and per-row generators, as in a rollout); ``generate`` runs them as one batch
with the global RNG. Prints Markdown and writes ``generation_speed.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["BenchConfig", "add_arguments", "main", "render", "run_benchmark"]


@dataclass(frozen=True)
class BenchConfig:
    """The model and the work of one round (see ``add_arguments``)."""

    rounds: int = 5
    batch: int = 8
    prompt_tokens: int = 48
    new_tokens: int = 64
    hidden_size: int = 128
    layers: int = 2
    threads: int = 1
    seed: int = 0


def _prompts(cfg: BenchConfig, vocab: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(cfg.seed)
    lengths = [cfg.prompt_tokens - (i % 4) * 4 for i in range(cfg.batch)]  # a ragged batch
    return [torch.randint(10, vocab, (n,), generator=generator).tolist() for n in lengths]


async def _engine_round(engine: Any, prompts: list[list[int]], cfg: BenchConfig, salt: int):
    from vt_train.engines import SamplingParams

    start = time.perf_counter()
    generations = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(max_new_tokens=cfg.new_tokens, seed=salt + i))
            for i, p in enumerate(prompts)
        )
    )
    return sum(len(g.token_ids) for g in generations), time.perf_counter() - start


def left_padded(prompts: list[list[int]], pad: int) -> tuple[Any, Any, int]:
    """``prompts`` as one left-padded batch for ``model.generate``: ids, mask, width."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    return ids, mask, width


def _generate_round(model: Any, prompts: list[list[int]], cfg: BenchConfig, pad: int):
    import torch

    ids, mask, width = left_padded(prompts, pad)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=cfg.new_tokens,
            pad_token_id=pad,
        )
    seconds = time.perf_counter() - start
    generated = out[:, width:]
    eos = model.generation_config.eos_token_id
    # Rows that ended early are padded after their eos: count up to and with it.
    counts = [
        int((row == eos).nonzero()[0]) + 1 if eos is not None and (row == eos).any() else len(row)
        for row in generated
    ]
    return sum(counts), seconds


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    import torch

    from vt_envs.core.tokenizer import default_tokenizer
    from vt_train.engines.hf import HFEngine
    from vt_train.model import TinyModelConfig, build_tiny_model

    torch.set_num_threads(cfg.threads)
    tokenizer = default_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=cfg.hidden_size, num_layers=cfg.layers, seed=cfg.seed),
        tokenizer,
    ).eval()
    prompts = _prompts(cfg, tokenizer.vocab_size)
    engine = HFEngine(model, tokenizer, max_batch_size=cfg.batch, seed=cfg.seed)
    torch.manual_seed(cfg.seed)

    async def rounds() -> dict[str, list[float]]:
        rates: dict[str, list[float]] = {"engine": [], "generate": []}
        await _engine_round(engine, prompts, cfg, 0)  # warm-up, both sides
        _generate_round(model, prompts, cfg, tokenizer.pad_token_id)
        for r in range(cfg.rounds):
            sides = ("engine", "generate") if r % 2 == 0 else ("generate", "engine")
            for side in sides:
                if side == "engine":
                    tokens, seconds = await _engine_round(engine, prompts, cfg, 1000 * (r + 1))
                else:
                    tokens, seconds = _generate_round(model, prompts, cfg, tokenizer.pad_token_id)
                rates[side].append(tokens / seconds)
        await engine.aclose()
        return rates

    rates = asyncio.run(rounds())
    engine_rate = statistics.median(rates["engine"])
    generate_rate = statistics.median(rates["generate"])
    return {
        "config": asdict(cfg),
        "engine_tokens_per_s": engine_rate,
        "generate_tokens_per_s": generate_rate,
        "ratio": engine_rate / generate_rate,
        "rounds": rates,
    }


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    return "\n".join(
        [
            "| side | generated tokens/s (median) |",
            "|---|---:|",
            f"| HFEngine (seeded rows) | {report['engine_tokens_per_s']:,.0f} |",
            f"| `model.generate` (one batch) | {report['generate_tokens_per_s']:,.0f} |",
            f"| HFEngine ÷ generate | **{report['ratio']:.2f}x** |",
            "",
            f"Tiny Qwen2 ({c['hidden_size']} wide, {c['layers']} layers), {c['batch']} rows of "
            f"{c['new_tokens']} new tokens at T=1 after ~{c['prompt_tokens']}-token prompts, "
            f"{c['threads']} torch thread(s); medians of {c['rounds']} alternating rounds.",
        ]
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BenchConfig()
    for name, help_text in (
        ("rounds", "alternating rounds"),
        ("batch", "rows (concurrent requests)"),
        ("prompt_tokens", "longest prompt"),
        ("new_tokens", "tokens generated per row"),
        ("hidden_size", "tiny model width"),
        ("layers", "tiny model depth"),
        ("threads", "torch threads"),
        ("seed", "seed of the model and the prompts"),
    ):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(defaults, name), help=help_text)
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")


def main(args: argparse.Namespace) -> int:
    cfg = BenchConfig(
        rounds=args.rounds,
        batch=args.batch,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        hidden_size=args.hidden_size,
        layers=args.layers,
        threads=args.threads,
        seed=args.seed,
    )
    report = run_benchmark(cfg)
    print(render(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "generation_speed.json").write_text(json.dumps(report, indent=2))
    return 0
