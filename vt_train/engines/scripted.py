"""A rollout engine that replays given token ids (for trainer and collector tests).

:class:`ScriptedEngine` behaves like a real engine at its edges: it stops at
eos (kept), at a stop string (kept, when it has a tokenizer to decode with)
and at ``max_new_tokens``; it returns a fixed fake logprob per token; and,
with ``delay_per_token_s``, it takes time proportional to the tokens it
returns, which is what the async-vs-sync rollout benchmark needs.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vt_envs.core.tokenizer import ChatTokenizer
from vt_envs.errors import InvalidConfigError

from .base import (
    EngineClosedError,
    FinishReason,
    Generation,
    RolloutEngine,
    SamplingParams,
    StopChecker,
)

__all__ = ["ScriptedEngine"]

Responder = Callable[[list[int]], Sequence[int]]


class ScriptedEngine(RolloutEngine):
    """Returns scripted token ids instead of sampling.

    Args:
        responses: either a list of id sequences, handed out one per
            :meth:`generate` call in call order (cycling when exhausted), or a
            function ``prompt_ids -> ids`` (e.g. an oracle that reads the
            prompt).
        eos_token_id: a response is cut after its first eos (finish ``"eos"``).
        tokenizer: needed to honour stop strings (decodes the tail); without
            one, ``params.stop`` is ignored.
        logprob: the fake log-probability reported for every token, by
            :meth:`generate` and :meth:`score` alike.
        delay_per_token_s: :meth:`generate` sleeps this long per returned
            token (asynchronously), so generation time follows token count.

    The finish reason is ``"eos"``, ``"stop"`` or ``"length"`` as in a real
    engine; a response that simply runs out (no eos, no stop string, shorter
    than ``max_new_tokens``) finishes with ``"stop"``.
    """

    def __init__(
        self,
        responses: Sequence[Sequence[int]] | Responder,
        *,
        eos_token_id: int,
        tokenizer: ChatTokenizer | None = None,
        logprob: float = math.log(0.5),
        delay_per_token_s: float = 0.0,
    ):
        if delay_per_token_s < 0:
            raise InvalidConfigError(f"delay_per_token_s must be >= 0, got {delay_per_token_s}")
        if callable(responses):
            self._respond: Responder = responses
        else:
            scripted = [list(r) for r in responses]
            if not scripted:
                raise InvalidConfigError("ScriptedEngine needs at least one response")
            cycle = itertools.cycle(scripted)
            self._respond = lambda prompt: next(cycle)
        self.eos_token_id = eos_token_id
        self.tokenizer = tokenizer
        self.logprob = float(logprob)
        self.delay_per_token_s = delay_per_token_s
        self.weights_version = 0
        self.prompts: list[list[int]] = []  # every prompt seen, for assertions in tests
        self.images: list[tuple[Any, ...]] = []  # the images given with each prompt
        self.last_state_dict: Mapping[str, Any] | None = None
        self._closed = False

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, images: Sequence[Any] = ()
    ) -> Generation:
        if self._closed:
            raise EngineClosedError("ScriptedEngine.generate called after aclose()")
        prompt = [int(t) for t in prompt_ids]
        self.prompts.append(prompt)
        self.images.append(tuple(images))
        token_ids, reason = self._cut([int(t) for t in self._respond(prompt)], params)
        if self.delay_per_token_s:
            await asyncio.sleep(self.delay_per_token_s * len(token_ids))
        return Generation(
            token_ids=token_ids,
            logprobs=[self.logprob] * len(token_ids),
            finish_reason=reason,
            metrics={"weights_version": float(self.weights_version)},
        )

    def _cut(self, ids: list[int], params: SamplingParams) -> tuple[list[int], FinishReason]:
        """Apply eos, stop strings and ``max_new_tokens`` token by token, in
        the order a sampling engine would meet them."""
        stop = StopChecker(params.stop, self.tokenizer.decode) if self.tokenizer else None
        for n, token in enumerate(ids[: params.max_new_tokens], start=1):
            if token == self.eos_token_id:
                return ids[:n], "eos"
            if stop and stop.hit(ids[:n]):
                return ids[:n], "stop"
        if len(ids) >= params.max_new_tokens:
            return ids[: params.max_new_tokens], "length"
        return ids, "stop"

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Records the state dict and bumps :attr:`weights_version`."""
        self.last_state_dict = state_dict
        self.weights_version += 1

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        return [[self.logprob] * max(len(s) - 1, 0) for s in sequences]

    async def aclose(self) -> None:
        self._closed = True
