"""``vt-train``: the trainer's command line.

    vt-train RECIPE.yaml [key=value ...]          RL (PPO / GRPO / ...) from a recipe
    vt-train sft RECIPE.yaml [key=value ...]      SFT warm-up on oracle trajectories
    vt-train resume RUN_DIR [key=value ...]       continue an RL run from its last checkpoint
    vt-train check RECIPE.yaml [...]              validate a recipe, estimate its GPU memory
    vt-train check RECIPE.yaml --dry-run [...]    ... and run one step of it on this CPU with a
                                                  tiny model of its family (vt_train.dry_run)

Data parallel over several processes (CPU gloo or GPUs):
``torchrun --nproc_per_node N -m vt_train.cli RECIPE.yaml [key=value ...]``.

Overrides use dotted keys and YAML values: ``algo=ppo rollout.n=8
optim.lr=5e-5``. The resolved config (the algorithm preset expanded) is written
to the run directory. User code: ``--import my_module`` (or ``imports:
[my_module]`` in the recipe) before the recipe is checked, so the names it
registers are valid; ``"module:attr"`` wherever a name goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from vt_envs.errors import console_main

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _rl(
    recipe: str | None, overrides: Sequence[str], imports: Sequence[str], *, resume: bool = False
) -> int:
    from vt_train.config import load_config
    from vt_train.run_dir import plot_reward_curve
    from vt_train.trainer import Trainer

    config = load_config(recipe, overrides, imports)
    trainer = Trainer(config)
    if resume:
        trainer.load_checkpoint()
    summary = trainer.train()
    trainer.close()
    if trainer.is_main:  # under torchrun, rank 0 reports
        plot = plot_reward_curve(config.output_dir, title=f"{config.algo} on {config.env.label}")
        print(json.dumps(summary, indent=2))
        print(f"run directory: {config.output_dir} (reward curve: {plot})")
    return 0


def _sft(recipe: str | None, overrides: Sequence[str], imports: Sequence[str]) -> int:
    from vt_envs.core.plugins import import_plugins
    from vt_train.sft import SFTRunConfig, run_sft_command

    import_plugins(imports)
    data = yaml.safe_load(Path(recipe).read_text()) if recipe else {}
    from vt_train.config import apply_overrides, from_dict

    config = from_dict(SFTRunConfig, apply_overrides(data or {}, overrides))
    print(json.dumps(run_sft_command(config), indent=2))
    return 0


def _check(recipe: str, overrides: Sequence[str], ns: argparse.Namespace) -> int:
    from vt_train.config import load_config, resolved_config_dict
    from vt_train.memory import estimate_memory, model_shape

    config = load_config(recipe, overrides, ns.imports)
    print(yaml.safe_dump(resolved_config_dict(config), sort_keys=False))
    print(f"# {recipe}: valid ({config.algo} on {config.env.label})")
    shape = model_shape(config)
    if shape is None:
        print("# memory: unknown architecture (no config.json in model.path); not estimated")
    else:
        print(estimate_memory(config, shape, gpus=ns.gpus, gpu_gib=ns.gpu_gib).table())
    if ns.dry_run:
        import tempfile

        from vt_train.dry_run import dry_run

        with tempfile.TemporaryDirectory(prefix="vt-dry-run-") as tmp:
            report = dry_run(config, ns.dry_run_dir or tmp)
            if not ns.dry_run_dir:
                report.pop("run_dir")  # deleted with the temporary directory
        print(json.dumps(report, indent=2))
        print(f"# {recipe}: dry run passed ({report['seconds']} s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vt-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command_or_recipe", help="a recipe path, or sft / resume / check")
    parser.add_argument(
        "args", nargs="*", help="recipe (for sft/check), run dir (resume), key=value"
    )
    from vt_envs.core.plugins import add_import_argument

    add_import_argument(
        parser, "advantages, losses, presets, env ids; recorded in the run's config.yaml"
    )
    check = parser.add_argument_group("check")
    check.add_argument("--dry-run", action="store_true", help="run one step on the CPU")
    check.add_argument("--dry-run-dir", help="keep the dry run's directory here")
    check.add_argument("--gpus", type=int, default=8, help="GPUs for the memory estimate")
    check.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU, GiB")
    ns = parser.parse_intermixed_args(argv)
    head, rest = ns.command_or_recipe, ns.args
    if head == "sft":
        recipe = rest[0] if rest and "=" not in rest[0] else None
        return _sft(recipe, rest[1:] if recipe else rest, ns.imports)
    if head == "check":
        if not rest:
            parser.error("check needs a recipe path")
        return _check(rest[0], rest[1:], ns)
    if head == "resume":
        if not rest:
            parser.error("resume needs a run directory")
        run_dir = Path(rest[0])
        overrides = [*rest[1:], f"output_dir={run_dir}"]
        return _rl(str(run_dir / "config.yaml"), overrides, ns.imports, resume=True)
    if "=" in head:  # only overrides: the default config
        return _rl(None, [head, *rest], ns.imports)
    return _rl(head, rest, ns.imports)


#: The ``vt-train`` console script: user errors in one line, exit 2 (``--debug``: traceback).
console = console_main("vt-train", main)

if __name__ == "__main__":
    console()
