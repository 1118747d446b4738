"""Run a batch's shared prefix through the decoder once.

Every row of a tool-env batch starts with the same system prompt (the
instructions and the tool descriptions): on VT-Math-v0 that is ~260 of a
row's ~320 tokens. A plain forward computes those positions once per row.
:func:`decoder_hidden` runs the longest prefix common to all rows once (batch
1), repeats its key/value cache across the batch and runs only the rest of
each row on top of it. The hidden states of the rest are those of the plain
forward (same attention, same positions: the cache holds what the prefix
positions would have computed), and the gradient flowing into the repeated
cache sums over the rows, as the plain forward's would.

The prefix positions' own hidden states are not returned: callers use the
fast path only when no position they need lies in the prefix
(``first_needed``). The fast path is taken only when it is exact and worth
it: a text-only decoder, no padding inside the prefix, a prefix of at least
:data:`MIN_PREFIX` tokens, more than one row, a cache the model actually
returns (Hugging Face turns the cache off under gradient checkpointing), and
rotary embeddings that do not depend on the sequence length (dynamic NTK and
LongRoPE scaling take the plain path).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "MIN_PREFIX",
    "decoder_hidden",
    "first_selected",
    "plan_prefix",
    "shared_prefix_length",
]

#: Shorter shared prefixes are not worth a second decoder call.
MIN_PREFIX = 32


def shared_prefix_length(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, first_needed: int
) -> int:
    """Positions ``[0, P)`` equal in every row and attended in every row, with
    ``P <= first_needed`` and at least one position left after the prefix."""
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= (attention_mask != 0).all(dim=0)
    run = int(same.int().cumprod(dim=0).sum())
    return max(0, min(run, first_needed, input_ids.shape[1] - 1))


def plan_prefix(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    first_needed: int,
) -> int:
    """The shared prefix :func:`decoder_hidden` would run once (0: the plain path).

    Several ranks whose decoders must make the same calls agree on it first
    (:mod:`vt_train.lockstep`): the prefix path calls the decoder twice."""
    rows = input_ids.shape[0]
    checkpointed = decoder.training and getattr(decoder, "gradient_checkpointing", False)
    # HF returns no cache under checkpointing; length-dependent RoPE would rotate the
    # prefix (seen alone, shorter) with other frequencies than the whole row's
    usable = rows > 1 and not checkpointed and not _length_dependent_rope(decoder)
    prefix = shared_prefix_length(input_ids, attention_mask, first_needed) if usable else 0
    return prefix if prefix >= MIN_PREFIX else 0


def decoder_hidden(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    first_needed: int | None = None,
    prefix: int | None = None,
) -> tuple[torch.Tensor, int]:
    """The decoder's last hidden states from position ``P`` on, and ``P``.

    ``first_needed``: the first position whose hidden state the caller uses
    (the prefix never covers it); ``P`` is then :func:`plan_prefix`'s choice.
    ``prefix``: ``P`` decided by the caller instead (0 forces the plain path).
    The result is ``[B, L - P, H]``.
    """
    if prefix is None:
        if first_needed is None:
            raise TypeError("decoder_hidden needs first_needed or prefix")
        prefix = plan_prefix(decoder, input_ids, attention_mask, first_needed=first_needed)
    if prefix > 0:
        rows = input_ids.shape[0]
        head = decoder(input_ids=input_ids[:1, :prefix], use_cache=True)
        cache = head.past_key_values
        if cache is not None:
            cache.batch_repeat_interleave(rows)
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            rest = decoder(
                input_ids=input_ids[:, prefix:],
                attention_mask=attention_mask,
                past_key_values=cache,
                use_cache=False,
            )
            return rest.last_hidden_state, prefix
    full = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return full.last_hidden_state, 0


def _length_dependent_rope(decoder: nn.Module) -> bool:
    """Whether the model's rotary frequencies depend on the sequence length (dynamic
    NTK, LongRoPE): then a prefix run alone is not the prefix of the whole row."""
    config = getattr(decoder, "config", None)
    for name in ("rope_scaling", "rope_parameters"):
        scaling = getattr(config, name, None)
        if isinstance(scaling, dict):
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind in _LENGTH_DEPENDENT_ROPE:
                return True
    return False


_LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


def first_selected(select: torch.Tensor) -> int:
    """The first position (column) where any row of ``select`` is non-zero; its
    length if none is."""
    hits = (select != 0).any(dim=0).nonzero()
    return int(hits[0]) if hits.numel() else select.shape[1]
