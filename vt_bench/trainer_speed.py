"""Trainer speed: the RL trainer's throughput on CPU with the tiny model.

A real :class:`vt_train.trainer.Trainer` on VT-Lookup-v0, built from
``load_config(None, overrides)``, measured in one run:

- ``update``: for GRPO and PPO, the rollout engine is replaced by a
  :class:`~vt_train.engines.ScriptedEngine` (half the samples look the key
  up and answer it, half guess), so rollouts cost next to nothing and the
  update dominates. Reported: ``perf/train_tokens_per_s`` from
  :meth:`Trainer.step`, i.e. every token of the step's trajectories (prompt
  and generated, all turns) over the update time (old/ref logprobs, values,
  advantages, the minibatch updates and the weight push);
- ``rollout``: the real HF engine (``rollout.engine=hf``) with the random
  tiny model, on the GRPO trainer after its update series. Its actions are
  junk, so episodes run to ``max_turns`` with full ``max_new_tokens`` turns:
  fine for speed. Reported: ``perf/rollout_tokens_per_s`` (all tokens over
  the rollout time) and generated tokens per second of rollout.

Each series is the median over ``--steps`` steps after one warm-up step
(the first step also builds the env's task index, which is not throughput).
The weight-sync logprob check is off (the scripted engine's logprobs are
fake). Prints Markdown and writes ``trainer_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ALGOS", "BenchConfig", "add_arguments", "main", "render", "run_benchmark"]

ALGOS = ("grpo", "ppo")


@dataclass(frozen=True)
class BenchConfig:
    """The model and the per-step work (see ``add_arguments``)."""

    steps: int = 5
    hidden_size: int = 128
    layers: int = 2
    tasks_per_step: int = 4
    n: int = 4
    max_new_tokens: int = 32
    threads: int = 1
    seed: int = 0

    @property
    def batch(self) -> int:
        return self.tasks_per_step * self.n


def _overrides(cfg: BenchConfig, algo: str, output_dir: Path) -> list[str]:
    tiny = (
        f"{{hidden_size: {cfg.hidden_size}, num_layers: {cfg.layers}, num_heads: 4, "
        f"num_kv_heads: 2, intermediate_size: {4 * cfg.hidden_size}}}"
    )
    return [
        f"algo={algo}",
        f"seed={cfg.seed}",
        f"output_dir={output_dir}",
        "rollout.engine=hf",
        f"rollout.tasks_per_step={cfg.tasks_per_step}",
        f"rollout.n={cfg.n}",
        f"rollout.max_new_tokens={cfg.max_new_tokens}",
        "rollout.sync_check=false",  # the scripted engine's logprobs are fake
        f"optim.minibatch_size={max(cfg.batch // 2, 1)}",  # two optimizer steps per RL step
        f"optim.micro_batch_size={max(cfg.batch // 4, 1)}",
        "env.eval_episodes=1",
        f"model.tiny={tiny}",
        f"torch_threads={cfg.threads}",
        "tensorboard=false",
    ]


class _HalfRight:
    """The scripted Lookup policy: on a first turn, alternately look the key up
    or guess ``000``; after a lookup, answer what the tool returned."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.calls = 0

    def __call__(self, prompt: list[int]) -> list[int]:
        text = self.tokenizer.decode(prompt)
        last_turn = text.rsplit("<|im_start|>", 2)[-2]
        if last_turn.startswith("tool\n"):
            value = last_turn.removeprefix("tool\n").split("<|im_end|>")[0].strip()
            return self.tokenizer.encode(f"<answer>{value}</answer>")
        self.calls += 1
        key = text.rsplit("key ", 1)[1].split("?")[0]
        action = f"<lookup>{key}</lookup>" if self.calls % 2 else "<answer>000</answer>"
        return self.tokenizer.encode(action)


def _measured_steps(trainer: Any, steps: int) -> list[dict[str, float]]:
    """One warm-up step, then ``steps`` steps; returns the measured steps' metrics."""
    trainer.step()
    return [trainer.step() for _ in range(steps)]


def _update_summary(metrics: list[dict[str, float]]) -> dict[str, Any]:
    rates = [m["perf/train_tokens_per_s"] for m in metrics]
    times = [m["time/update_s"] for m in metrics]
    return {
        "train_tokens_per_s_median": statistics.median(rates),
        "train_tokens_per_s_all": rates,
        "update_s_median": statistics.median(times),
        "tokens_per_step_mean": statistics.fmean(r * t for r, t in zip(rates, times)),
        "mean_reward": statistics.fmean(m["rollout/mean_reward"] for m in metrics),
    }


def _rollout_summary(metrics: list[dict[str, float]], batch: int) -> dict[str, Any]:
    times = [m["time/rollout_s"] for m in metrics]
    generated = [m["rollout/mean_generated_tokens"] * batch / m["time/rollout_s"] for m in metrics]
    return {
        "rollout_tokens_per_s_median": statistics.median(
            m["perf/rollout_tokens_per_s"] for m in metrics
        ),
        "generated_tokens_per_s_median": statistics.median(generated),
        "rollout_s_median": statistics.median(times),
        "tokens_per_step_mean": statistics.fmean(
            m["perf/rollout_tokens_per_s"] * m["time/rollout_s"] for m in metrics
        ),
        "generated_tokens_per_step_mean": statistics.fmean(
            m["rollout/mean_generated_tokens"] * batch for m in metrics
        ),
        "mean_turns": statistics.fmean(m["rollout/mean_turns"] for m in metrics),
    }


def _run_algo(
    cfg: BenchConfig, algo: str, workdir: Path, *, hf_rollout: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from vt_train.config import load_config
    from vt_train.engines import ScriptedEngine
    from vt_train.trainer import Trainer

    trainer = Trainer(load_config(None, _overrides(cfg, algo, workdir / algo)))
    hf_engine = trainer.engine
    tok = trainer.tokenizer
    trainer.engine = ScriptedEngine(_HalfRight(tok), eos_token_id=tok.eos_token_id, tokenizer=tok)
    try:
        update = _update_summary(_measured_steps(trainer, cfg.steps))
        rollout = None
        if hf_rollout:
            hf_engine.load_weights(trainer.actor.full_state_dict())
            trainer.engine = hf_engine
            rollout = _rollout_summary(_measured_steps(trainer, cfg.steps), cfg.batch)
    finally:
        trainer.engine = hf_engine  # the trainer closes the engine it holds
        trainer.close()
    return update, rollout


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Run every series; returns the JSON-ready report."""
    import torch

    update: dict[str, Any] = {}
    rollout: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="vt-trainer-speed-") as tmp:
        for algo in ALGOS:
            update[algo], hf = _run_algo(cfg, algo, Path(tmp), hf_rollout=algo == ALGOS[0])
            rollout = rollout or hf
    return {
        "update": update,
        "rollout_hf": rollout,
        "ppo_vs_grpo_update_time": update["ppo"]["update_s_median"]
        / update["grpo"]["update_s_median"],
        "config": asdict(cfg),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def render(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    c = report["config"]
    rows = [
        "| series | tokens/s (median) | s/step (median) | tokens/step |",
        "|---|---:|---:|---:|",
    ]
    for algo, u in report["update"].items():
        rows.append(
            f"| {algo} update | {u['train_tokens_per_s_median']:,.0f} | {u['update_s_median']:.3f} "
            f"| {u['tokens_per_step_mean']:,.0f} |"
        )
    r = report["rollout_hf"]
    rows += [
        f"| hf rollout, all tokens | {r['rollout_tokens_per_s_median']:,.0f} "
        f"| {r['rollout_s_median']:.3f} | {r['tokens_per_step_mean']:,.0f} |",
        f"| hf rollout, generated tokens | {r['generated_tokens_per_s_median']:,.0f} "
        f"| {r['rollout_s_median']:.3f} | {r['generated_tokens_per_step_mean']:,.0f} |",
        "",
        f"Tiny Qwen2 policy (hidden {c['hidden_size']}, {c['layers']} layers), CPU, "
        f"{c['threads']} torch thread(s); VT-Lookup-v0, {c['tasks_per_step']} tasks x "
        f"{c['n']} samples per step, median of {c['steps']} steps after a warm-up step. "
        f"Update tokens are all tokens of the step's trajectories (prompt and generated); "
        f"PPO's critic makes its update **{report['ppo_vs_grpo_update_time']:.2f}x** as long "
        f"as GRPO's. The HF rollout plays the random model ({r['mean_turns']:.1f} turns, "
        f"up to {c['max_new_tokens']} new tokens each).",
    ]
    return "\n".join(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    parser.add_argument(
        "--steps", type=int, default=d.steps, help="measured steps per series (after a warm-up)"
    )
    parser.add_argument(
        "--hidden-size", type=int, default=d.hidden_size, help="tiny model width (4 heads)"
    )
    parser.add_argument("--layers", type=int, default=d.layers, help="tiny model depth")
    parser.add_argument(
        "--tasks-per-step", type=int, default=d.tasks_per_step, help="distinct tasks per step"
    )
    parser.add_argument("--n", type=int, default=d.n, help="samples per task (a group)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=d.max_new_tokens, help="generation budget per turn"
    )
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads")
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def main(args: argparse.Namespace) -> int:
    cfg = BenchConfig(
        steps=args.steps,
        hidden_size=args.hidden_size,
        layers=args.layers,
        tasks_per_step=args.tasks_per_step,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads,
    )
    report = run_benchmark(cfg)
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "trainer_speed.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0
