"""Bridges from VT to other training libraries.

- :mod:`vt_train.integrations.trl`: train on ``gym.make("VT-...")`` envs with TRL's own
  ``GRPOTrainer`` (its ``rollout_func`` hook), token ids taken from VT's episodes.
- :mod:`vt_train.integrations.datasets_export`: evaluation / rollout records
  (``rollouts.jsonl``) as a Hugging Face ``datasets.Dataset`` that TRL's ``SFTTrainer`` reads.

Both need the ``trl`` extra (``pip install -e ".[trl]"``: ``trl`` and ``datasets``); nothing
else in VT imports them. See ``docs/trl.md``.
"""
