"""Token log-probabilities without a full ``[B, L, V]`` logits tensor.

A causal LM's logits over a long context and a large vocabulary dominate a
training step's memory: ``B x L x V`` in fp32 is about 20 GB for a 7B
model's micro-batch of 4 x 8192 tokens over 152k ids, before
``log_softmax`` copies it. The trainer needs the logprob (and, for logging
or an entropy bonus, the entropy) of the *generated* tokens only.

:class:`LogprobModel` wraps a Hugging Face causal LM. Its forward runs the
decoder, keeps the hidden states of the requested positions, and applies the
LM head to them in chunks of ``chunk_size`` positions; under autograd each
chunk runs inside ``torch.utils.checkpoint``, so its ``[chunk, V]`` logits
are freed after the forward and recomputed one chunk at a time in the
backward. Peak logits memory is one chunk, not the batch.

It is the module handed to DeepSpeed (so ZeRO-3's parameter hooks see every
call), and its ``state_dict`` keys are the wrapped model's (the ``lm.``
prefix is hidden), so weight syncs and exports see plain Hugging Face names.

Vision-language models (Qwen2-VL): ``pixel_values`` and ``image_grid_thw``
go to the model's multimodal trunk with its own 3-D positions
(:func:`vt_train.vision.trunk_hidden`), and the vision token ids — which only
the env places — get probability 0, as the rollout engines sample them
(:func:`vt_train.vision.vision_token_ids`), so both sides score one
distribution.

A text model's batch runs its rows' shared prefix (the system prompt)
through the decoder once (:mod:`vt_train.prefix`); the logprobs are those of
the plain forward.

On several ranks (``lockstep.enabled``, set by the trainer) every forward
makes the same module calls on every rank, as ZeRO-3 requires
(:mod:`vt_train.lockstep`): the ranks agree on the number of LM-head chunks
(a rank with fewer positions runs zero-weight calls on one zero hidden
state, kept in the autograd graph so the backward matches too) and on the
shared-prefix path (taken only if every rank can).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vt_train.lockstep import Lockstep
from vt_train.prefix import decoder_hidden, first_selected, plan_prefix
from vt_train.vision import is_vision_language, trunk_hidden, vision_token_ids

__all__ = ["LogprobModel", "ban_tokens"]


def ban_tokens(logits: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    """``logits`` with the ``banned`` ids (last dimension) set to ``-inf``."""
    if banned is None or not banned.numel():
        return logits
    return logits.index_fill(-1, banned.to(logits.device), float("-inf"))


def _head(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    entropy: bool,
    banned: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = ban_tokens(head(hidden).float() / temperature, banned)  # [chunk, V], freed after
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets[:, None])[:, 0] - lse
    if not entropy:
        return picked, torch.zeros_like(picked)
    probs = torch.softmax(logits, dim=-1)
    return picked, lse - (probs * logits.masked_fill(probs == 0, 0.0)).sum(-1)


class LogprobModel(nn.Module):
    """A causal LM whose forward returns per-token logprobs (and entropy), ``[B, L]``.

    ``forward(input_ids, attention_mask, positions=None, temperature=1.0,
    entropy=False)``: index ``t`` of the result is ``log p(token_t |
    tokens_<t)`` under ``softmax(logits / temperature)`` (the logits at
    ``t - 1``); index 0 and every position where ``positions`` is 0 hold 0.
    ``positions`` (``[B, L]``, e.g. the loss mask) selects where to compute;
    ``None`` means every real token (``attention_mask``). With ``entropy``
    the second result is the entropy of that distribution at the same
    positions, else ``None``. ``pixel_values`` / ``image_grid_thw``: the
    images of the batch's rows, in order (a vision-language ``lm`` only).

    Args:
        lm: the causal LM (``get_decoder()`` and ``get_output_embeddings()``,
            as every Hugging Face ``*ForCausalLM`` has), or a Qwen2-VL-style
            ``*ForConditionalGeneration``.
        chunk_size: positions per LM-head chunk.
    """

    def __init__(self, lm: nn.Module, *, chunk_size: int = 1024):
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        banned = vision_token_ids(lm.config) if is_vision_language(lm) else ()
        # Not a buffer: it must not appear in the state dict the engines load.
        self._banned = torch.tensor(banned, dtype=torch.long) if banned else None
        self.lockstep = Lockstep()

    @property
    def config(self) -> Any:
        return self.lm.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        temperature: float = 1.0,
        entropy: bool = False,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        select = positions if positions is not None else attention_mask
        where = (
            select[:, 1:] != 0
            if select is not None
            else torch.ones_like(input_ids[:, 1:], dtype=torch.bool)
        )  # column h: the hidden state at h scores token h + 1
        text = pixel_values is None and not is_vision_language(self.lm)
        decoder = None
        prefix = 0
        if text:  # the rows' shared prefix (the system prompt) runs once: vt_train.prefix
            decoder = self.lm.get_decoder() if hasattr(self.lm, "get_decoder") else self.lm
            prefix = plan_prefix(
                decoder, input_ids, attention_mask, first_needed=first_selected(where)
            )
        chunks = -(-int(where.sum()) // self.chunk_size)
        (chunks,), (shared,), _ = self.lockstep.agree(
            input_ids.device, maximum=[chunks], every=[prefix > 0]
        )
        if text:
            hidden, skip = decoder_hidden(
                decoder, input_ids, attention_mask, prefix=prefix if shared else 0
            )
        else:
            hidden, skip = (
                trunk_hidden(  # scoring only: no KV cache to build
                    self.lm,
                    input_ids,
                    attention_mask,
                    pixel_values=pixel_values,
                    image_grid_thw=image_grid_thw,
                ),
                0,
            )
        where = where[:, skip:]
        picked_hidden = hidden[:, :-1][where]  # [N, H]
        targets = input_ids[:, 1 + skip :][where]
        pieces, entropies, ballast = [], [], []
        for index in range(chunks):
            start = index * self.chunk_size
            h = picked_hidden[start : start + self.chunk_size]
            t = targets[start : start + self.chunk_size]
            if not len(t):  # another rank has more chunks: the same call, at zero weight
                # On a hidden state taken from the graph, not a constant: ZeRO-3 releases a
                # module's parameters after the backward reaches its inputs, so the call's
                # input must need a gradient on this rank as on the others.
                zero = hidden[:1, 0] * 0.0
                lp, ent = self._head(zero, targets.new_zeros(1), temperature, entropy)
                ballast.append(lp.sum() + ent.sum())
                continue
            lp, ent = self._head(h, t, temperature, entropy)
            pieces.append(lp)
            entropies.append(ent)
        logprobs = hidden.new_zeros(input_ids.shape, dtype=torch.float32)
        ent_out = logprobs.clone() if entropy else None
        if pieces:
            logprobs[:, 1 + skip :][where] = torch.cat(pieces)
            if ent_out is not None:
                ent_out[:, 1 + skip :][where] = torch.cat(entropies)
        if ballast:  # zero, but in the graph: the backward visits the head as often
            logprobs = logprobs + 0.0 * torch.stack(ballast).sum()
        return logprobs, ent_out

    def _head(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One LM-head chunk; under autograd recomputed in the backward (checkpointed)."""
        args = (
            self.lm.get_output_embeddings(),
            hidden,
            targets,
            temperature,
            entropy,
            self._banned,
        )
        if torch.is_grad_enabled():
            return checkpoint(_head, *args, use_reentrant=False)
        return _head(*args)

    # The wrapped model's parameter names, so syncs and exports see HF names.
    def lm_state_dict(self) -> dict[str, torch.Tensor]:
        return self.lm.state_dict()
