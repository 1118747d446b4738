"""Constants shared by the trainer tests (importable: tests/train is on sys.path)."""

#: A tiny Qwen2 shape: fast enough for unit tests on one CPU thread.
SMALL_MODEL = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position_embeddings=256,
)
