"""The trainer learns: a tiny model starts calling the tool under GRPO.

The quickstart pipeline at reduced size (two-phase SFT, then 16 GRPO steps on
VT-Lookup-v0). After SFT the policy mostly guesses (the tool is used in a few
percent of sampled episodes, never greedily); RL must make it look the key
up, and held-out accuracy must follow. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

from vt_train.quickstart import run_quickstart


def test_grpo_teaches_the_tiny_model_to_use_the_tool(tmp_path):
    summary = run_quickstart(
        tmp_path, seed=0, sft_steps=300, mix_steps=60, rl_steps=16, eval_episodes=64
    )
    before, after = summary["before"], summary["after"]
    assert before["eval_t1/tool_use_rate"] < 0.3 and before["eval/accuracy"] < 0.1
    assert after["eval_t1/tool_use_rate"] > before["eval_t1/tool_use_rate"] + 0.3
    assert after["eval/accuracy"] > before["eval/accuracy"] + 0.5
    assert (tmp_path / "rl" / "reward_curve.png").stat().st_size > 0
    assert (tmp_path / "REPORT.md").read_text().startswith("# Quickstart")
