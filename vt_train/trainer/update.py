"""One RL update of a :class:`~vt_train.trainer.Trainer`: old and reference logprobs,
values and advantages attached to the batch (:meth:`_prepare`), then ``epochs`` passes of
minibatch updates, each minibatch split into micro-batches whose losses are normalized by
the minibatch-wide counts, every rank making as many backward passes (:meth:`_update`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vt_train.algorithms import (
    ADVANTAGES,
    POLICY_LOSSES,
    aggregate,
    kl_penalty,
    kl_token_rewards,
    loss_normalizers,
    masked_mean,
    value_loss,
)
from vt_train.batch import TrainBatch
from vt_train.forwards import Scorers
from vt_train.trainer.distributed import _all_reduce_sums

# Metrics that are masked means over a micro-batch's generated tokens: the
# step reports their token-weighted mean (not a mean of micro-batch means).
_TOKEN_MEANS = (
    "policy/clip_frac",
    "policy/dual_clip_frac",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/seq_ratio_mean",
    "critic/vf_clip_frac",
    "critic/values_mean",
)


class _Updates:
    """The :class:`~vt_train.trainer.Trainer` methods that score a batch and update the
    actor (and critic) on it (a mixin: they read and set the trainer's state)."""

    def _logprobs(
        self, model: Any, mb: TrainBatch, *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprobs (and entropy) of ``mb``'s generated tokens under ``model``, ``[B, L]``."""
        return self.forwards.logprobs(
            model, mb.input_ids, mb.attention_mask, mb.loss_mask, mb.row_images(), entropy=entropy
        )

    @torch.no_grad()
    def _prepare(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """Attach old/ref logprobs, values, advantages and returns to ``batch``."""
        cfg, algo = self.config, self.algo
        batch = batch.to(self.device)
        mask = batch.loss_mask
        self.actor.eval()
        if self.critic is not None:
            self.critic.eval()
        recompute = cfg.rollout.logprobs == "recompute"
        # Each rank scores its share of the rows; the results are all-gathered.
        scored = self.forwards.score_rows(
            batch,
            Scorers(self.actor if recompute else None, self.reference, self.critic),
            cfg.optim.micro_batch_size,
        )
        old = scored["old_logprobs"] if recompute else batch.rollout_logprobs
        extras: dict[str, torch.Tensor] = {"old_logprobs": old * mask}
        gap = (old - batch.rollout_logprobs) * mask
        metrics = {
            "rollout/logprob_abs_diff": float(masked_mean(gap.abs(), mask)),
            "rollout/logprob_max_abs_diff": float(gap.abs().max()) if mask.any() else 0.0,
        }
        is_weights, is_metrics = _rollout_is_weights(gap, mask, algo)
        metrics.update(is_metrics)
        if is_weights is not None:
            extras["is_weights"] = is_weights
        token_rewards = None
        if self.reference is not None:
            extras["ref_logprobs"] = ref = scored["ref_logprobs"]
            if algo.kl_in_reward:
                token_rewards = kl_token_rewards(old, ref, mask, algo)
        values = scored.get("old_values")
        if values is not None:
            extras["old_values"] = values
        advantages, returns = ADVANTAGES.get(algo.advantage)(
            batch.rewards, mask, batch.group_ids, algo, values=values, token_rewards=token_rewards
        )
        extras.update(advantages=advantages, returns=returns)
        metrics["rollout/advantage_abs_mean"] = float(masked_mean(advantages.abs(), mask))
        return batch.with_extras(**extras), metrics

    def _dummy_backward(self, boundary: bool) -> None:
        """A zero-gradient pass, so a rank with no rows left makes the same module calls
        and joins the same reductions as the others (:meth:`Forwards.dummy_rows`)."""
        ids, positions, images = self.forwards.dummy_rows()
        ones = torch.ones_like(ids)
        want_entropy = self.algo.entropy_coef > 0 or self.config.optim.log_entropy
        logprobs, _ = self.forwards.logprobs(
            self.actor, ids, ones, positions, images, entropy=want_entropy
        )
        self.actor.backward(logprobs.sum() * 0.0, boundary=boundary)
        if self.critic is not None:
            values = self.forwards.values(self.critic, ids, ones, images)
            self.critic.backward(values.sum() * 0.0, boundary=boundary)

    def _micro_step(
        self, mb: TrainBatch, norm: Mapping[str, float], *, boundary: bool
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Forward and backward one micro-batch; returns ``(sums, token_sums)``:
        its share of the minibatch losses, and masked means times its token count."""
        algo = self.algo
        mask = mb.loss_mask
        want_entropy = algo.entropy_coef > 0 or self.config.optim.log_entropy
        logprobs, entropy = self._logprobs(self.actor, mb, entropy=want_entropy)
        loss_mat, pg_metrics = POLICY_LOSSES.get(algo.policy_loss)(
            logprobs, mb.extras["old_logprobs"], mb.extras["advantages"], mask, algo
        )
        if "is_weights" in mb.extras:
            loss_mat = loss_mat * mb.extras["is_weights"]
        agg = dict(num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"], config=algo)
        loss = aggregate(loss_mat, mask, algo.loss_agg, **agg)
        tokens = float((mask > 0).sum())
        sums = {"policy/pg_loss": float(loss.detach())}
        token_sums = {k: float(v) * tokens for k, v in pg_metrics.items()}
        if self.reference is not None and not algo.kl_in_reward:
            kl = aggregate(
                kl_penalty(logprobs, mb.extras["ref_logprobs"], mask, algo),
                mask,
                algo.loss_agg,
                **agg,
            )
            loss = loss + algo.kl_coef * kl
            sums["policy/kl_ref"] = float(kl.detach())
        if entropy is not None:
            ent = aggregate(entropy, mask, algo.loss_agg, **agg)
            if algo.entropy_coef:
                loss = loss - algo.entropy_coef * ent
            sums["policy/entropy"] = float(ent.detach())
        # DeepSpeed averages gradients over ranks; the loss is normalized by
        # the global counts, so scale by the world size to get their sum.
        self.actor.backward(loss * self.world, boundary=boundary)
        if self.critic is not None:
            values = self.forwards.values(
                self.critic, mb.input_ids, mb.attention_mask, mb.row_images()
            )
            v_mat, v_metrics = value_loss(
                values, mb.extras["old_values"], mb.extras["returns"], mask, algo
            )
            v_loss = algo.vf_coef * aggregate(v_mat, mask, algo.loss_agg, **agg)
            self.critic.backward(v_loss * self.world, boundary=boundary)
            sums["critic/vf_loss"] = float(v_loss.detach())
            token_sums.update({k: float(v) * tokens for k, v in v_metrics.items()})
        token_sums["_tokens"] = tokens
        return sums, token_sums

    def _update(self, batch: TrainBatch) -> dict[str, float]:
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + self.step_index)
        sums: dict[str, float] = {}
        token_sums: dict[str, float] = {}
        grad_norms: list[float] = []
        minibatches = 0
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        for _ in range(cfg.optim.epochs):
            for minibatch in batch.minibatches(
                cfg.optim.minibatch_size, shuffle=True, generator=generator
            ):
                norm = loss_normalizers(minibatch.loss_mask)  # global: the whole minibatch
                rows = minibatch.select(
                    range(self.rank, len(minibatch), self.world), normalize=False
                )
                micro = rows.split(cfg.optim.micro_batch_size) if len(rows) else []
                # every rank runs as many backward passes (each one all-reduces)
                per_rank = -(-len(minibatch) // self.world)
                passes = -(-per_rank // cfg.optim.micro_batch_size)
                for i in range(passes):
                    boundary = i == passes - 1
                    if i >= len(micro):
                        self._dummy_backward(boundary)
                        continue
                    part, part_tokens = self._micro_step(micro[i], norm, boundary=boundary)
                    _add(sums, part)
                    _add(token_sums, part_tokens)
                grad_norms.append(self.actor.step(self.updates))
                if self.critic is not None:
                    self.critic.step(self.updates)
                self.updates += 1
                minibatches += 1
        sums = _all_reduce_sums(sums, self.world, self.device)
        token_sums = _all_reduce_sums(token_sums, self.world, self.device)
        tokens = max(token_sums.pop("_tokens", 0.0), 1.0)
        metrics = {k: v / minibatches for k, v in sums.items()}  # a minibatch's loss, on average
        metrics.update({k: v / tokens for k, v in token_sums.items()})
        metrics["policy/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        return metrics

    @torch.no_grad()
    def _reference_logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        """The trainer's ``log p(token_t | tokens_<t)`` of each probe sequence, t >= 1
        (``images[i]``: sequence ``i``'s images)."""
        self.actor.eval()
        out = []
        for i, seq in enumerate(sequences):
            ids = torch.tensor([list(seq)], device=self.device)
            ones = torch.ones_like(ids)
            pictures = images[i] if images is not None else ()
            logprobs, _ = self.forwards.logprobs(
                self.actor, ids, ones, ones, pictures, temperature=temperature
            )
            out.append(logprobs[0, 1:].float().tolist())
        return out


def _rollout_is_weights(
    gap: torch.Tensor, mask: torch.Tensor, algo: Any
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Truncated importance weights ``min(p_trainer / p_rollout, cap)`` (token or sequence
    level, ``algo.rollout_is``), and their metrics, which are logged either way."""
    m = mask > 0
    token = torch.exp(gap.clamp(max=20.0))
    seq = torch.exp((gap * m).sum(-1).clamp(max=20.0))
    metrics = {
        "rollout/is_token_weight_mean": float(masked_mean(token, m)),
        "rollout/is_token_clip_frac": float(masked_mean((token > algo.rollout_is_cap).float(), m)),
    }
    if algo.rollout_is is None:
        return None, metrics
    if algo.rollout_is == "token":
        weights = token.clamp(max=algo.rollout_is_cap)
    else:
        weights = seq.clamp(max=algo.rollout_is_cap)[:, None].expand_as(gap)
    return torch.where(m, weights, 0.0), metrics


def _add(into: dict[str, float], values: Mapping[str, float]) -> None:
    for key, value in values.items():
        into[key] = into.get(key, 0.0) + value
