"""The RL trainer: rollout → old/ref logprobs → advantages → updates → weight sync.

One :meth:`Trainer.step` reads top to bottom like the algorithm:

1. sample ``tasks_per_step`` train tasks (a pure function of ``(seed, step)``,
   so a resumed run draws the same ones) and play ``n`` episodes of each
   through the vector env with the rollout engine (trajectory-level async);
2. with dynamic sampling (DAPO's ``filter_groups``), drop the groups whose
   rewards are all equal and play rounds of fresh tasks until the step has
   ``tasks_per_step`` groups that differ (or ``max_sampling_rounds`` ran out);
3. old logprobs (recomputed by the trainer's model, or the engine's rollout
   logprobs), reference logprobs (if KL is on) and values ``V(s_t)`` (PPO);
4. advantages from the algorithm's estimator;
5. ``epochs`` passes of minibatch updates, each minibatch split into
   micro-batches whose losses are normalized by the minibatch-wide counts;
   DeepSpeed is told where each minibatch's accumulation ends, so every ZeRO
   stage applies the same update;
6. push the new weights into the rollout engine and check that its logprobs
   on a probe agree with the trainer's (a gross gap means stale weights);
7. log metrics (JSONL + TensorBoard): losses summed over micro-batches and
   ranks, token-weighted means over every generated token of the step.

Devices: the models live on ``config.device`` (DeepSpeed's device); every
tensor the trainer builds is created there or moved there before it meets a
model.

Vision-language policies (``model.vision``, or a Qwen2-VL ``model.path``):
the processor directory goes to every env and engine; trajectories carry
their images by reference into :class:`TrainBatch`, and every forward (old,
reference and new logprobs, values, the sync probe) turns its rows' images
into pixel values for that forward only (:mod:`vt_train.vision`). Image-pad
ids are observation ids, so the loss mask never covers them.

The package, by concern: :mod:`.loop` (:class:`Trainer`, built in named steps; its
step, learn and train), :mod:`.build` (models, tokenizer, processor, engine keywords,
envs), :mod:`.rollouts` (tasks, episodes, dynamic sampling, evaluation), :mod:`.update`
(old/ref logprobs, advantages, minibatch updates), :mod:`.checkpoint` (save, resume) and
:mod:`.distributed` (seeding, placement, collectives).
"""

from __future__ import annotations

# _load_partitioned and _rollout_is_weights: private helpers that vt_bench and the tests
# import from here. Patch a helper where it is looked up (vt_train.trainer.build,
# .loop, ...): a patch of this package's name reaches no caller.
from vt_train.trainer.build import _load_partitioned as _load_partitioned
from vt_train.trainer.build import check_same_tokenizer
from vt_train.trainer.loop import Trainer
from vt_train.trainer.update import _rollout_is_weights as _rollout_is_weights
from vt_train.weight_sync import sync_tolerances

__all__ = ["Trainer", "check_same_tokenizer", "sync_tolerances"]
