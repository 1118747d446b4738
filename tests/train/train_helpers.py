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

#: Data-parallel test: 4 tasks x 4 samples, minibatches of 8 rows split over
#: ranks into micro-batches of 3 (uneven on purpose).
DP_OVERRIDES = [
    *TRAINER_OVERRIDES,
    "rollout.tasks_per_step=4",
    "optim.minibatch_size=8",
    "optim.micro_batch_size=3",
]
