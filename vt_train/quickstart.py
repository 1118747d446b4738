"""``make quickstart``: a tiny policy learns to compute with sandboxed Python, on a 2-core CPU.

1. Build the project's tiny Qwen2 model (0.75M parameters) on VT's default
   tokenizer — nothing is downloaded.
2. SFT warm-up through the env, token-in/token-out, in two phases: the
   teacher's trajectories (the format, and copying the operands into code and
   the interpreter's output into the answer), then a 70% guess / 30% teacher
   mixture, so the warm policy calls the tool only sometimes and RL has a
   *decision* to learn.
3. GRPO with the DeepSpeed trainer, the HF rollout engine and
   trajectory-level async rollouts; held-out accuracy (greedy and sampled)
   before, during and after.

Two recipes (``--env``):

- ``math`` (default): ``VT-Math-v0``'s ``big_product`` family at difficulty 1
  (``Compute 413 × 307.``: two 3-digit factors, a 5–6 digit product). A guess
  is right about once in a million; ``print(413 * 307)`` in the real
  sandboxed interpreter (bubblewrap, seccomp, rlimits; recycled between
  episodes) and copying what it printed always is.
- ``lookup``: the ``VT-Lookup-v0`` sanity env (``make quickstart-lookup``).

The seed draws the tiny model's initial weights, the SFT episodes, guesses
and batches, and the RL tasks and samples. ``--seeds 0 1 2`` runs the recipe
once per seed (``OUT/seed{N}``) and writes
``OUT/SEEDS.md``, the table the README shows. The run directory holds the SFT
model, the RL metrics (JSONL + TensorBoard), checkpoints, transcripts, the
reward curve and ``REPORT.md``. With a fixed seed the numbers reproduce on the
same machine and library versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class Recipe:
    """One quickstart: the env, how SFT demonstrates it, and the RL sizes.

    Attributes:
        env_id: the registered env trained and evaluated on.
        env_kwargs: ``vt_envs.make`` keywords (both splits, SFT and RL).
        teacher: SFT's demonstrating policy (``"module:Class"``; ``None``: the
            env's registered oracle).
        task: how the README and the report name the task.
        max_new_tokens: the most tokens one turn generates.
        max_context: the longest context a rollout may reach.
        sft_steps, mix_steps, rl_steps: default phase lengths.
        num_trajectories: distinct SFT episodes collected per phase.
    """

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    teacher: str | None = None
    task: str = ""
    max_new_tokens: int = 8
    max_context: int = 256
    sft_steps: int = 300
    mix_steps: int = 60
    rl_steps: int = 40
    num_trajectories: int = 2000


RECIPES: dict[str, Recipe] = {
    "math": Recipe(
        env_id="VT-Math-v0",
        # No prestart: each sub-env's sandbox starts at its first call and is then
        # recycled for its next episode (a ~3 ms hand-over); a prestarted one would
        # sit idle beside it in each of the 128 sub-envs (train + eval).
        # No worked examples: they are for pretrained models that read them; this
        # from-scratch model learns the format by SFT, in a 384-token context.
        env_kwargs={"families": ["big_product"], "difficulty": 1, "max_turns": 4, "examples": []},
        teacher="vt_envs.domains.math.oracle:MathCodePolicy",
        task="products of two 3-digit numbers, computed in the sandboxed Python interpreter",
        max_new_tokens=16,
        max_context=384,
        sft_steps=500,
        num_trajectories=1000,
    ),
    "lookup": Recipe(
        env_id="VT-Lookup-v0",
        env_kwargs={"examples": []},
        task="a key's value, read with the lookup tool",
    ),
}

#: The RL recipe shared by both envs (every field documented in vt_train.config).
RL_OVERRIDES = [
    "algo=grpo",
    "algorithm={loss_agg: token-mean}",
    "env.eval_temperatures=[0.0, 1.0]",
    "rollout.engine=hf",
    "rollout.tasks_per_step=8",
    "rollout.n=8",
    "rollout.temperature=1.0",
    "optim.lr=1.0e-4",
    "optim.betas=[0.9, 0.99]",
    "optim.minibatch_size=64",
    "optim.micro_batch_size=64",
    "deepspeed={zero_stage: 0, bf16: false, torch_adam: true, grad_clip: 1.0}",
    "torch_threads=1",
]


def run_quickstart(
    out: Path,
    *,
    recipe: Recipe | str = "math",
    seed: int = 0,
    sft_steps: int | None = None,
    mix_steps: int | None = None,
    rl_steps: int | None = None,
    eval_episodes: int = 200,
    progress: bool = True,
) -> dict[str, Any]:
    """SFT then GRPO; returns the summary written to ``out/summary.json``.

    Phase lengths default to the recipe's.
    """
    from vt_train.config import load_config
    from vt_train.model import TinyModelConfig
    from vt_train.run_dir import plot_reward_curve
    from vt_train.sft import SFTConfig, SFTRunConfig, run_sft_command
    from vt_train.trainer import Trainer

    recipe = RECIPES[recipe] if isinstance(recipe, str) else recipe
    sft_steps = recipe.sft_steps if sft_steps is None else sft_steps
    mix_steps = recipe.mix_steps if mix_steps is None else mix_steps
    rl_steps = recipe.rl_steps if rl_steps is None else rl_steps
    timings: dict[str, float] = {}
    start = time.perf_counter()
    sft = run_sft_command(
        SFTRunConfig(
            model=TinyModelConfig(seed=seed),  # the seed also draws the initial weights
            sft=SFTConfig(
                env_id=recipe.env_id,
                env_kwargs=dict(recipe.env_kwargs),
                teacher=recipe.teacher,
                num_trajectories=recipe.num_trajectories,
                steps=sft_steps,
                lr=1e-3,
                seed=seed,
            ),
            mix_steps=mix_steps,
            output_dir=str(out / "sft"),
            eval_episodes=0,
            eval_max_new_tokens=recipe.max_new_tokens,
            progress=progress,
        )
    )
    timings["sft_s"] = time.perf_counter() - start

    start = time.perf_counter()
    config = load_config(
        None,
        [
            *RL_OVERRIDES,
            f"env.id={recipe.env_id}",
            f"env.kwargs={json.dumps(recipe.env_kwargs)}",
            f"rollout.max_new_tokens={recipe.max_new_tokens}",
            f"rollout.max_context={recipe.max_context}",
            f"seed={seed}",
            f"steps={rl_steps}",
            f"eval_every={max(rl_steps // 4, 1)}",
            f"env.eval_episodes={eval_episodes}",
            f"init_from={sft['model_dir']}",
            f"output_dir={out / 'rl'}",
        ],
    )
    trainer = Trainer(config)
    try:
        result = trainer.train(progress=progress)
    finally:
        trainer.close()
    timings["rl_s"] = time.perf_counter() - start
    plot = plot_reward_curve(out / "rl", title=f"GRPO on {recipe.env_id} (tiny Qwen2, CPU)")
    summary = {
        **result,
        "env_id": recipe.env_id,
        "seed": seed,
        "rl_steps": rl_steps,
        "sft": sft,
        "timings_s": timings,
        "plot": str(plot),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "REPORT.md").write_text(render_report(summary, recipe))
    return summary


_REPORT_ROWS = [
    ("greedy accuracy", "eval/accuracy"),
    ("greedy tool-use rate", "eval/tool_use_rate"),
    ("sampled (T=1) accuracy", "eval_t1/accuracy"),
    ("sampled (T=1) tool-use rate", "eval_t1/tool_use_rate"),
]


def render_report(summary: dict[str, Any], recipe: Recipe) -> str:
    """``REPORT.md`` of one run: held-out metrics after SFT and after RL, and timings."""
    before, after, timings = summary["before"], summary["after"], summary["timings_s"]
    lines = [
        f"# Quickstart: GRPO on {recipe.env_id} (seed {summary['seed']})",
        "",
        f"Task: {recipe.task}.",
        "",
        "| held-out (test split) | after SFT | after RL |",
        "|---|---:|---:|",
        *[f"| {name} | {before[key]:.3f} | {after[key]:.3f} |" for name, key in _REPORT_ROWS],
        "",
        f"SFT {timings['sft_s']:.0f} s, RL ({summary['rl_steps']} steps, with evaluations) "
        f"{timings['rl_s']:.0f} s. Reward curve: `{summary['plot']}`.",
    ]
    return "\n".join(lines) + "\n"


def render_seeds(summaries: list[dict[str, Any]], recipe: Recipe) -> str:
    """``SEEDS.md``: one row per seed, held-out accuracy and tool use before/after RL."""
    lines = [
        f"# Quickstart on {recipe.env_id}: one row per seed",
        "",
        "| seed | greedy acc. after SFT → after RL | T=1 acc. after SFT → after RL "
        "| T=1 tool use after SFT → after RL | wall (SFT + RL) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        b, a, t = s["before"], s["after"], s["timings_s"]
        lines.append(
            f"| {s['seed']} | {b['eval/accuracy']:.3f} → {a['eval/accuracy']:.3f} "
            f"| {b['eval_t1/accuracy']:.3f} → {a['eval_t1/accuracy']:.3f} "
            f"| {b['eval_t1/tool_use_rate']:.3f} → {a['eval_t1/tool_use_rate']:.3f} "
            f"| {(t['sft_s'] + t['rl_s']) / 60:.1f} min |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(RECIPES), default="math", help="the recipe")
    parser.add_argument("--out", default="runs/quickstart", help="run directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="run once per seed (OUT/seed{N}) and write SEEDS.md"
    )
    parser.add_argument("--sft-steps", type=int, help="SFT phase 1 (teacher) steps")
    parser.add_argument("--mix-steps", type=int, help="SFT phase 2 (70%% guess) steps")
    parser.add_argument("--rl-steps", type=int)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    out, recipe = Path(args.out), RECIPES[args.env]
    seeds = args.seeds or [args.seed]
    summaries = []
    for seed in seeds:
        run_dir = out / f"seed{seed}" if args.seeds else out
        summaries.append(
            run_quickstart(
                run_dir,
                recipe=recipe,
                seed=seed,
                sft_steps=args.sft_steps,
                mix_steps=args.mix_steps,
                rl_steps=args.rl_steps,
                eval_episodes=args.eval_episodes,
                progress=not args.no_progress,
            )
        )
        print((run_dir / "REPORT.md").read_text())
        print(f"run directory: {run_dir}")
    if args.seeds:
        (out / "SEEDS.md").write_text(render_seeds(summaries, recipe))
        print((out / "SEEDS.md").read_text())
    learned = all(s["after"]["eval/accuracy"] > s["before"]["eval/accuracy"] for s in summaries)
    return 0 if learned else 1


if __name__ == "__main__":
    sys.exit(main())
