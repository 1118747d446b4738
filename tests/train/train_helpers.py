"""Constants and scripted policies shared by the trainer tests
(importable: tests/train is on sys.path)."""

from vt_envs.core.tokenizer import load_tokenizer

#: A tiny Qwen2 shape: fast enough for unit tests on one CPU thread.
SMALL_MODEL = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position_embeddings=256,
)


class ScriptedLookupPolicy:
    """A scripted VT-Lookup-v0 policy for ``ScriptedEngine``: on the first turn
    it alternately looks the key up or guesses ``000`` (so every group of an
    even size has rewards 1 and 0); after a lookup it answers the value."""

    def __init__(self) -> None:
        self.calls = 0
        self.tok = load_tokenizer()

    def __call__(self, prompt: list[int]) -> list[int]:
        text = self.tok.decode(prompt)
        last_turn = text.rsplit("<|im_start|>", 2)[-2]
        if last_turn.startswith("tool\n"):
            value = last_turn.removeprefix("tool\n").split("<|im_end|>")[0]
            return self.tok.encode(f"<answer>{value}</answer>")
        self.calls += 1
        key = text.rsplit("key ", 1)[1].split("?")[0]
        action = f"<lookup>{key}</lookup>" if self.calls % 2 else "<answer>000</answer>"
        return self.tok.encode(action)


#: A small, fast RL config for trainer tests (scripted rollouts, tiny model).
TRAINER_OVERRIDES = [
    "rollout.tasks_per_step=2",
    "rollout.n=4",
    "rollout.mode=sync",
    "rollout.max_new_tokens=16",
    "rollout.sync_check=false",  # the scripted engine's logprobs are fake
    "optim.minibatch_size=4",
    "optim.micro_batch_size=2",
    "optim.lr=1e-3",
    "env.eval_episodes=4",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
    "intermediate_size: 64}",
    "tensorboard=false",
]


def saved_tiny_model(directory) -> str:
    """TRAINER_OVERRIDES' tiny model (seed 0) saved as a model directory, for runs that
    load ``model.path`` (under ZeRO-3: built partitioned)."""
    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    shape = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    tok = load_tokenizer()
    save_pretrained_with_tokenizer(build_tiny_model(TinyModelConfig(**shape), tok), tok, directory)
    return str(directory)


#: The tiny vision-language policy's shape (Qwen2-VL architecture) for trainer tests.
VL_MODEL = [
    "env.id=VT-Visual-v0",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
    "intermediate_size: 64, max_position_embeddings: 4096}",
    "model.vision={depth: 1, embed_dim: 16, num_heads: 2, max_pixels: 50176}",
]


def dp_overrides(mode: str) -> list[str]:
    """The data-parallel test's config (``mode``: ``"text"`` or ``"vl"``).

    ``text``: 6 tasks x 2 samples, minibatches of 3 rows (rank 0 trains on two of
    them, rank 1 on one), LM-head chunks of 8 positions (each row needs several).
    ``vl``: 8 rows in one minibatch of micro-batches of 2.
    """
    if mode == "text":
        shape = ["rollout.tasks_per_step=6", "optim.minibatch_size=3"]
        return [*TRAINER_OVERRIDES, *shape, "rollout.n=2", "optim.logprob_chunk_size=8"]
    return [
        *TRAINER_OVERRIDES,
        *VL_MODEL,
        "rollout.tasks_per_step=4",
        "rollout.n=2",
        "optim.minibatch_size=8",
        "optim.micro_batch_size=2",
        "optim.logprob_chunk_size=8",
    ]


def vl_trajectories(trainer, rows: int = 8) -> list:
    """``rows`` two-sample groups of made-up trajectories for a vision-language trainer,
    exactly one of which holds an image: whatever the shuffle, the image lies on one
    rank only, in prepare and in the update. Rewards alternate 1, 0 within groups."""
    import numpy as np

    from vt_train.trajectory import Trajectory

    config = trainer.actor.module.lm.config
    tok = trainer.tokenizer
    prompt = tok.encode("Which of the two is brighter? Answer with a letter.")
    image = np.random.default_rng(0).integers(0, 256, size=(56, 84, 3), dtype=np.uint8)
    span = [
        config.vision_start_token_id,
        *[config.image_token_id] * trainer.image_inputs.tokens(image),
        config.vision_end_token_id,
    ]
    out = []
    for i in range(rows):
        answer = tok.encode(f"<answer>{'AB'[i % 2]}</answer> because {i}")
        head = prompt + (span if i == 0 else [])
        ids = head + answer
        out.append(
            Trajectory(
                task_id=f"t{i // 2}",
                group_id=i // 2,
                input_ids=ids,
                loss_mask=[0] * len(head) + [1] * len(answer),
                rollout_logprobs=[0.0] * len(ids),
                prompt_length=len(head),
                reward=float(i % 2 == 0),
                images=[image] if i == 0 else [],
                image_spans=[(len(prompt), len(head))] if i == 0 else [],
            )
        )
    return out
