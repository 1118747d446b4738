"""Multi-turn generation: prefix cache vs re-prefill vs ``model.generate`` per turn.

``--episodes`` episodes of ``--turns`` turns each run concurrently on one
model: turn 1's prompt is ``--prompt-tokens`` ids; each later turn's prompt is
the last prompt, the ``--new-tokens`` ids sampled then (T=1, seeded) and an
``--obs-tokens``-id observation, as a rollout builds it (ids, never
re-encoded). Three sides, in one process, alternating order over
``--rounds``:

- ``prefix cache``: :class:`~vt_train.engines.hf.HFEngine` as shipped (a turn
  prefills only what came after the kept prefix);
- ``re-prefill``: the same engine with ``prefix_cache_mb=0`` (every turn
  prefills the whole conversation: the engine before the cache);
- ``generate``: ``model.generate`` once per turn on all episodes' prompts,
  left-padded into one batch (what a loop around transformers does);
- ``vllm`` (with ``--vllm``, in the vLLM virtualenv): ``vllm.LLM`` with
  automatic prefix caching, all episodes' turn-k prompts in one
  ``generate`` call per turn (token ids in, ids out); its prefill tokens are
  the prompt tokens vLLM did not find in its cache (``num_cached_tokens``,
  counted in blocks).

Reported per side (medians over rounds): wall time of the whole set of
episodes, the process's CPU time meanwhile (on a machine shared with other
jobs the CPU time is the steadier comparison: waiting for a core does not
count; not for the vllm side, whose engine runs in other processes), prefill
tokens per episode, generated tokens per second. The model
is a packaged model's name (default ``smollm2-135m-instruct``), a model
directory, or ``tiny`` (a tiny random Qwen2, for tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["MultiTurnConfig", "add_arguments", "main", "render", "run_multiturn"]

SIDES = ("prefix cache", "re-prefill", "generate")
VLLM_SIDE = "vllm"


@dataclass(frozen=True)
class MultiTurnConfig:
    model: str = "smollm2-135m-instruct"
    episodes: int = 8
    turns: int = 8
    prompt_tokens: int = 300
    obs_tokens: int = 40
    new_tokens: int = 32
    rounds: int = 1
    threads: int = 1
    seed: int = 0
    vllm: bool = False


def _load(cfg: MultiTurnConfig) -> tuple[Any, Any]:
    from vt_envs.core.tokenizer import default_tokenizer, load_tokenizer
    from vt_train.vision import load_policy

    if cfg.model == "tiny":
        from vt_train.model import TinyModelConfig, build_tiny_model

        tokenizer = default_tokenizer()
        return build_tiny_model(TinyModelConfig(seed=cfg.seed), tokenizer).eval(), tokenizer
    return load_policy(cfg.model).eval(), load_tokenizer(cfg.model)


def _ids(cfg: MultiTurnConfig, vocab: int, n: int, salt: int) -> list[int]:
    import torch

    generator = torch.Generator().manual_seed(cfg.seed * 7919 + salt)
    return torch.randint(10, vocab - 10, (n,), generator=generator).tolist()


async def _engine_side(engine: Any, cfg: MultiTurnConfig, vocab: int) -> tuple[int, int]:
    """All episodes at once; (prefill tokens, generated tokens)."""
    from vt_train.engines import SamplingParams

    async def episode(e: int) -> int:
        prompt, generated = _ids(cfg, vocab, cfg.prompt_tokens, e), 0
        for turn in range(cfg.turns):
            params = SamplingParams(max_new_tokens=cfg.new_tokens, seed=1000 * e + turn)
            out = await engine.generate(prompt, params)
            generated += len(out.token_ids)
            prompt = prompt + out.token_ids + _ids(cfg, vocab, cfg.obs_tokens, 100 * e + turn)
        return generated

    before = engine.prefill_tokens
    generated = sum(await asyncio.gather(*(episode(e) for e in range(cfg.episodes))))
    return engine.prefill_tokens - before, generated


def _generate_side(model: Any, cfg: MultiTurnConfig, vocab: int, pad: int) -> tuple[int, int]:
    import torch

    from vt_bench.generation_speed import left_padded

    prompts = [_ids(cfg, vocab, cfg.prompt_tokens, e) for e in range(cfg.episodes)]
    prefill = generated = 0
    with torch.inference_mode():
        for turn in range(cfg.turns):
            ids, mask, width = left_padded(prompts, pad)
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                max_new_tokens=cfg.new_tokens, pad_token_id=pad,
            )  # fmt: skip
            prefill += sum(len(p) for p in prompts)
            for e, row in enumerate(out[:, width:].tolist()):
                generated += len(row)
                obs = _ids(cfg, vocab, cfg.obs_tokens, 100 * e + turn)
                prompts[e] = prompts[e] + row + obs
    return prefill, generated


def _vllm_engine(cfg: MultiTurnConfig, model: Any, tokenizer: Any, scratch: Path) -> Any:
    """``vllm.LLM`` on the benchmark's model (``tiny``: the HF sides' model, saved)."""
    import os

    from vllm import LLM

    from vt_envs.core.packaged_models import resolve_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if cfg.model == "tiny":
        from vt_train.model import save_pretrained_with_tokenizer

        save_pretrained_with_tokenizer(model, tokenizer, scratch)
        path = str(scratch)
    else:
        path = resolve_model(cfg.model)
    context = cfg.prompt_tokens + cfg.turns * (cfg.new_tokens + cfg.obs_tokens) + 16
    return LLM(
        model=path, dtype="float32", enable_prefix_caching=True,
        max_model_len=context, max_num_seqs=max(cfg.episodes, 1), enforce_eager=True,
        seed=cfg.seed,
    )  # fmt: skip


def _vllm_side(llm: Any, cfg: MultiTurnConfig, vocab: int) -> tuple[int, int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.reset_prefix_cache()  # each round starts cold, as the HF sides do
    prompts = [_ids(cfg, vocab, cfg.prompt_tokens, e) for e in range(cfg.episodes)]
    prefill = generated = 0
    for turn in range(cfg.turns):
        params = [
            SamplingParams(max_tokens=cfg.new_tokens, temperature=1.0, seed=1000 * e + turn)
            for e in range(cfg.episodes)
        ]
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        for e, out in enumerate(outs):
            row = list(out.outputs[0].token_ids)
            prefill += len(prompts[e]) - (out.num_cached_tokens or 0)
            generated += len(row)
            prompts[e] = prompts[e] + row + _ids(cfg, vocab, cfg.obs_tokens, 100 * e + turn)
    return prefill, generated


def run_multiturn(cfg: MultiTurnConfig) -> dict[str, Any]:
    import torch

    from vt_train.engines.hf import HFEngine

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model, tokenizer = _load(cfg)
    vocab, pad = tokenizer.vocab_size, tokenizer.pad_token_id
    sides = (*SIDES, VLLM_SIDE) if cfg.vllm else SIDES
    scratch = tempfile.TemporaryDirectory(prefix="vt_multiturn_") if cfg.vllm else None
    # Started once, before the rounds: start-up is not a turn.
    llm = _vllm_engine(cfg, model, tokenizer, Path(scratch.name)) if scratch else None
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for r in range(cfg.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for side in order:
            start, cpu = time.perf_counter(), time.process_time()
            if side == VLLM_SIDE:
                prefill, generated = _vllm_side(llm, cfg, vocab)
            elif side == "generate":
                prefill, generated = _generate_side(model, cfg, vocab, pad)
            else:
                mb = 0 if side == "re-prefill" else 1024
                engine = HFEngine(model, tokenizer, max_batch_size=cfg.episodes, prefix_cache_mb=mb)
                prefill, generated = asyncio.run(_engine_side(engine, cfg, vocab))
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            runs[side].append(
                {"wall_s": wall, "cpu_s": cpu, "prefill_per_episode": prefill / cfg.episodes,
                 "generated_per_s": generated / wall},
            )  # fmt: skip
    if scratch is not None:
        scratch.cleanup()
    summary = {
        side: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
        for side, rows in runs.items()
    }
    return {"config": asdict(cfg), "sides": summary, "rounds": runs}


def render(report: dict[str, Any]) -> str:
    c, sides = report["config"], report["sides"]
    base, base_cpu = sides["re-prefill"]["wall_s"], sides["re-prefill"]["cpu_s"]
    lines = [
        "| side | wall (s) | vs re-prefill | CPU (s) | vs re-prefill (CPU) | "
        "prefill tokens / episode | generated tokens/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side in sides:
        s = sides[side]
        cpu = "n/a" if side == VLLM_SIDE else f"{s['cpu_s']:.1f}"
        cpu_ratio = "n/a" if side == VLLM_SIDE else f"{base_cpu / s['cpu_s']:.2f}x"
        lines.append(
            f"| {side} | {s['wall_s']:.1f} | {base / s['wall_s']:.2f}x | {cpu} | {cpu_ratio} | "
            f"{s['prefill_per_episode']:,.0f} | {s['generated_per_s']:,.1f} |"
        )
    lines += [
        "",
        f"{c['model']}: {c['episodes']} concurrent episodes x {c['turns']} turns, "
        f"{c['prompt_tokens']}-token first prompt, {c['obs_tokens']}-token observations, "
        f"{c['new_tokens']} sampled tokens a turn (T=1), {c['threads']} torch thread(s); "
        f"medians of {c['rounds']} round(s), sides alternating.",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = MultiTurnConfig()
    parser.add_argument("--model", default=defaults.model, help="name, directory or 'tiny'")
    for name in ("episodes", "turns", "prompt_tokens", "obs_tokens", "new_tokens", "rounds"):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(defaults, name))
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--vllm", action="store_true", help="add vllm-cpu with prefix caching (vLLM venv)"
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")


def main(args: argparse.Namespace) -> int:
    names = [f.name for f in fields(MultiTurnConfig)]
    report = run_multiturn(MultiTurnConfig(**{name: getattr(args, name) for name in names}))
    print(render(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "multiturn_speed.json").write_text(json.dumps(report, indent=2))
    return 0
