"""One policy over three domains through `vt-train configs/mixture_grpo_cpu.yaml`: every
domain's rollout and held-out metrics land in metrics.jsonl and the plot."""

from __future__ import annotations

import json

MIXTURE = {"VT-Math-v0", "VT-SQL-v0", "VT-Search-v0"}
PER_DOMAIN = ("accuracy", "mean_reward", "mean_turns", "tool_calls", "tool_error_rate")


def test_the_cpu_mixture_recipe_logs_every_domain(tmp_path):
    from vt_train.cli import main

    out = tmp_path / "run"
    argv = [
        "configs/mixture_grpo_cpu.yaml",
        "steps=1",
        "rollout.tasks_per_step=6",
        "rollout.n=2",
        "optim.minibatch_size=12",
        "optim.micro_batch_size=12",
        "env.eval_episodes=12",
        f"output_dir={out}",
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    (update,) = [r for r in records if "policy/grad_norm" in r]
    rollout_domains = {k.split("/")[1] for k in update if k.startswith("rollout/VT-")}
    assert rollout_domains <= MIXTURE and len(rollout_domains) >= 2
    total = sum(update[f"rollout/{d}/episodes"] for d in rollout_domains)
    assert total == 12  # every trajectory counted in exactly one domain
    evals = [r for r in records if "eval/accuracy" in r]
    assert len(evals) == 2  # before and after
    for record in evals:  # 12 held-out tasks drawn by weight: every domain is there
        assert {k.split("/")[1] for k in record if k.startswith("eval/VT-")} == MIXTURE
        for domain in MIXTURE:
            for name in PER_DOMAIN:
                assert f"eval/{domain}/{name}" in record
        assert sum(record[f"eval/{d}/episodes"] for d in MIXTURE) == 12
    assert (out / "reward_curve.png").stat().st_size > 0
