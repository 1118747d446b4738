"""VT side of the GRPO comparison: ``Trainer.step()`` (HF-engine rollouts on a
single-turn VT-Lookup-v0, then the GRPO update on DeepSpeed ZeRO-0), timed per step."""

from __future__ import annotations

import time

from _loop import serve


def setup(params):
    import tempfile

    from vt_train.config import load_config
    from vt_train.trainer import Trainer

    out = tempfile.mkdtemp(prefix="vt-peers-grpo-")
    batch = params["prompts_per_step"] * params["group"]
    config = load_config(None, [
        "algo=grpo", "env.id=VT-Lookup-v0", "env.kwargs={max_turns: 1}", "rollout.engine=hf",
        f"rollout.tasks_per_step={params['prompts_per_step']}", f"rollout.n={params['group']}",
        "rollout.temperature=1.0", f"rollout.max_new_tokens={params['max_new_tokens']}",
        f"optim.lr={params['lr']}", f"optim.minibatch_size={batch}",
        f"optim.micro_batch_size={batch}",
        "algorithm={kl_coef: 0.0}",
        "deepspeed={zero_stage: 0, bf16: false, torch_adam: true, grad_clip: 1.0}",
        "torch_threads=1", "steps=1000000", "eval_every=1000000", "env.eval_episodes=1",
        f"init_from={params['model_dir']}", f"output_dir={out}", "seed=0",
        f"rollout.max_context={params.get('max_context', 1024)}",
    ])  # fmt: skip
    return Trainer(config)


def run(trainer, n):
    start = time.perf_counter()
    steps = [trainer.step() for _ in range(n)]
    seconds = time.perf_counter() - start
    phases = {
        "rollout (generation + reward)": sum(m["time/rollout_s"] for m in steps),
        "update (logprobs + step)": sum(m["time/update_s"] for m in steps),
    }
    return n, sum(m.get("rollout/mean_reward", 0.0) for m in steps), seconds, phases


if __name__ == "__main__":
    serve(setup, run)
