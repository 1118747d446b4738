"""``vt-bench export DIR --out DATASET_DIR``: an evaluation's records as a Hugging Face
dataset (``datasets.Dataset.save_to_disk``) that TRL's ``SFTTrainer`` reads.

One row per rollout: the episode as chat messages (with ``tool_calls``), its token ids and
assistant masks (see :mod:`vt_train.integrations.datasets_export`). Load it with
``datasets.load_from_disk(DATASET_DIR)``. Needs the ``trl`` extra (``datasets``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vt_envs.errors import InvalidConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="an eval directory (rollouts.jsonl[.gz]) or a records file")
    parser.add_argument("--out", required=True, help="the dataset directory (save_to_disk)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="ENV_ID",
        help="only this env id's records (repeatable; default: every env id)",
    )  # fmt: skip
    parser.add_argument(
        "--min-reward", type=float, default=None,
        help="only rollouts with at least this reward (e.g. 1: the solved ones, for SFT)",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default=None,
        help="the envs' tokenizer for the replay (default: the eval's config.json)",
    )  # fmt: skip


def main(args: argparse.Namespace) -> int:
    try:
        from vt_train.integrations.datasets_export import records_to_dataset
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise InvalidConfigError(
            f"vt-bench export needs `datasets`: pip install -e '.[trl]' ({exc})"
        ) from exc
    dataset = records_to_dataset(
        Path(args.dir),
        env_ids=args.env or None,
        min_reward=args.min_reward,
        tokenizer=args.tokenizer,
    )
    dataset.save_to_disk(args.out)
    envs = sorted(set(dataset["env_id"]))
    print(f"{len(dataset)} rollouts of {', '.join(envs)} -> {args.out}")
    return 0
