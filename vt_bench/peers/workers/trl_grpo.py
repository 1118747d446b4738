"""TRL side of the GRPO comparison: ``GRPOTrainer`` on the same model directory, prompts,
group size, completion length and learning rate; each optimizer step timed (generation
included), not the trainer's start-up."""

from __future__ import annotations

import time

from _loop import serve


def setup(params):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    golds = {p["text"]: p["gold"] for p in params["prompts"]}

    def reward(prompts, completions, **kwargs):
        return [float(f"<answer>{golds[p]}</answer>" in c) for p, c in zip(prompts, completions)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds, self.started = 0.0, 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds += time.perf_counter() - self.started

    batch = params["prompts_per_step"] * params["group"]
    config = GRPOConfig(
        output_dir=params["out"], per_device_train_batch_size=batch,
        num_generations=params["group"], max_completion_length=params["max_new_tokens"],
        learning_rate=params["lr"], beta=0.0, temperature=1.0, logging_steps=1000000,
        save_strategy="no", report_to="none", use_cpu=True, bf16=False, max_steps=1, seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(params["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(params["model_dir"], dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": p["text"]} for p in params["prompts"]] * 64)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])  # fmt: skip
    timer.parts = {"generate": 0.0, "generate_and_score": 0.0}
    for name, method in (("generate", "_generate"),
                         ("generate_and_score", "_generate_and_score_completions")):  # fmt: skip
        setattr(trainer, method, _timed(getattr(trainer, method), timer.parts, name))
    return trainer, timer


def _timed(method, parts, name):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            parts[name] += time.perf_counter() - start

    return timed


def run(state, n):
    trainer, timer = state
    trainer.args.max_steps = n
    timer.seconds = 0.0
    timer.parts.update(generate=0.0, generate_and_score=0.0)
    trainer.train()
    generated, scored = timer.parts["generate"], timer.parts["generate_and_score"]
    phases = {
        "rollout (generation + reward)": scored,  # _generate_and_score_completions
        "of which generation": generated,  # _generate
        "update (logprobs + step)": timer.seconds - scored,
    }
    return n, 0.0, timer.seconds, phases


if __name__ == "__main__":
    serve(setup, run)
