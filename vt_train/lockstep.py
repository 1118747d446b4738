"""Ranks that make the same module calls: agreements taken before a forward.

ZeRO-3 gathers a module's parameters each time the module is called (an
all-gather per call, a reduce-scatter of its gradients in the backward), so
two ranks that call different modules, or one module a different number of
times, pair unrelated collectives: gloo fails with "distributed collective
mismatch", NCCL hangs. ZeRO-1/2 reduce gradients in buckets filled in the
order parameters receive them, so a module one rank skips (a vision tower
on a rank without images) breaks them too.

Whatever a forward decides from a rank's own rows is therefore agreed across
the ranks first: how many LM-head chunks its rows need (the others pad with
zero-weight calls), whether its rows share a prefix worth running once (all
ranks or none), whether its micro-batch holds images (any rank: the others
add a zero-weight dummy image). One small all-reduce per forward settles
them all; outside ``torch.distributed`` (or with one rank) nothing is
exchanged and each rank's own values stand.

Contract: while :attr:`Lockstep.enabled`, every rank calls :meth:`Lockstep.agree`
the same number of times in the same order — that is, every rank runs the
same sequence of forwards, real or dummy (the trainer's pass counts see to it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Lockstep", "world_size"]


def world_size() -> int:
    """Ranks in the default process group (1 outside ``torch.distributed``)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


class Lockstep:
    """Agreement across ranks on the values that shape a forward's module calls.

    ``enabled`` is set by the trainer when it runs on several ranks; while it is
    off, :meth:`agree` returns its arguments unchanged and communicates nothing.
    ``calls`` counts the agreements taken (a test checks ranks stay in step).
    """

    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.calls = 0

    def agree(
        self,
        device: torch.device,
        *,
        maximum: Sequence[int] = (),
        every: Sequence[bool] = (),
        any_of: Sequence[bool] = (),
    ) -> tuple[list[int], list[bool], list[bool]]:
        """The largest of each ``maximum`` value over the ranks, whether each ``every``
        flag holds on all ranks, and whether each ``any_of`` flag holds on some rank:
        one all-reduce (MAX) on ``device`` for all of them."""
        if not self.enabled or world_size() == 1:
            return list(maximum), list(every), list(any_of)
        import torch.distributed as dist

        # MAX of x, of (not flag) and of flag: "every" is "no rank says not".
        values = [*maximum, *(int(not f) for f in every), *(int(f) for f in any_of)]
        tensor = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        self.calls += 1
        out = tensor.tolist()
        m, e = len(maximum), len(every)
        return out[:m], [v == 0 for v in out[m : m + e]], [v == 1 for v in out[m + e :]]
