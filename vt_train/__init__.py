"""vt_train: batched vLLM / Hugging Face policies over VT vector envs, updated
with PPO / GRPO (and variants) on DeepSpeed.

Dependencies point one way: ``vt_train`` imports ``vt_envs``, never the reverse.
"""

__version__ = "0.1.0"
