"""The rollout-engine protocol: generate from token ids, load new weights.

Every backend (vLLM, Hugging Face transformers, scripted) implements
:class:`RolloutEngine`. Requests are per trajectory and async, so a rollout
collector can advance each trajectory independently; engines batch whatever
requests are pending internally.

Log-probabilities are of the *sampling* distribution: ``log_softmax(logits /
temperature)`` at each generated position. The trainer recomputes its own
logprobs the same way, so the two agree up to numerics when the weights are
in sync (:func:`logprob_agreement` checks exactly that after each sync).

Images: a vision-language engine takes the trajectory's images so far
(``images=``, read-only ``HxWx3 uint8`` arrays in the order their tokens
appear in ``prompt_ids``) and never samples the vision token ids (only the
env places those; the trainer gives them probability 0 too). A text engine
given images raises :class:`~vt_envs.errors.InvalidConfigError`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vt_envs.errors import InvalidConfigError, VTError

__all__ = [
    "EngineClosedError",
    "FinishReason",
    "Generation",
    "RolloutEngine",
    "SamplingParams",
    "StopChecker",
    "reject_images",
]

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn.

    Attributes:
        max_new_tokens: generation stops after this many tokens (``"length"``).
        temperature: softmax temperature; ``0`` means greedy.
        top_p: nucleus sampling mass (1.0 = off).
        stop: strings at which generation stops; the stop string is KEPT in
            the output (the env's parser needs the closing tag).
        seed: per-request seed for reproducible sampling (``None``: engine RNG).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidConfigError(
                f"SamplingParams.top_p must be in (0, 1] (1.0 turns nucleus sampling off); "
                f"got {self.top_p!r}"
            )
        if self.temperature < 0:
            raise InvalidConfigError(
                f"SamplingParams.temperature must be >= 0 (0 is greedy); got {self.temperature!r}"
            )
        if self.max_new_tokens < 0:
            raise InvalidConfigError(
                f"SamplingParams.max_new_tokens must be >= 0 (0 generates nothing); got "
                f"{self.max_new_tokens!r}"
            )


@dataclass
class Generation:
    """One turn's generated tokens.

    Attributes:
        token_ids: the generated ids, exactly as sampled (never re-tokenized).
        logprobs: ``log p(token)`` under the sampling distribution, one per id.
        finish_reason: ``"stop"`` (a stop string), ``"eos"`` (the eos token,
            which is included in ``token_ids``), or ``"length"``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutEngine(abc.ABC):
    """A policy that generates from token ids and can take new weights.

    Attributes:
        weights_version: how many times :meth:`load_weights` has succeeded
            (0: the weights the engine was built with).
    """

    weights_version: int = 0

    @abc.abstractmethod
    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        images: Sequence[Any] = (),
    ) -> Generation:
        """Continue ``prompt_ids`` (the whole context so far) for one turn; ``images``
        are the context's images, in order."""

    @abc.abstractmethod
    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Replace the policy's weights (a full state dict of the trainer's model)."""

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Replace the policy's weights from a stream of ``(name, tensor)`` pairs (Hugging
        Face names; tied weights may be left out), in the order the trainer gathers them.

        The trainer syncs through this method: an engine that overrides it copies each
        tensor as it arrives, so neither side ever holds a whole second copy of the
        model (the trainer gathers a ZeRO-3 model shard by shard). This default collects
        the stream into one dict for :meth:`load_weights`."""
        self.load_weights(dict(weights))

    @abc.abstractmethod
    def score(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[float]]:
        """``log p(token_t | tokens_<t)`` for t >= 1 of each sequence (a probe for sync
        checks); ``images[i]`` are sequence ``i``'s images."""

    async def aclose(self) -> None:
        """Release engine resources."""


class EngineClosedError(VTError, RuntimeError):
    """Raised when an engine is used after ``aclose()``."""


class StopChecker:
    """Detects the token that completes a stop string, on the decoded tail.

    Engines call :meth:`hit` after each generated token with all ids
    generated so far (never the prompt: a stop string in the prompt does not
    stop generation). Only a window of the last ids is decoded: a stop string
    of ``n`` characters spans at most ``4 * n`` byte-level tokens, plus one
    for a token that starts mid-character. Because generation stops at the
    first hit, any match in the window was completed by the newest token,
    which is kept (stop strings are kept in the output, as with vLLM's
    ``include_stop_str_in_output=True``).
    """

    def __init__(self, stop: Sequence[str], decode: Callable[[Sequence[int]], str]):
        self.stop = tuple(s for s in stop if s)
        self._decode = decode
        self._window = 4 * max((len(s) for s in self.stop), default=0) + 1

    def __bool__(self) -> bool:
        return bool(self.stop)

    def hit(self, generated: Sequence[int]) -> bool:
        """True if ``generated`` (the ids so far) contains a stop string."""
        if not self.stop or not generated:
            return False
        text = self._decode(list(generated[-self._window :]))
        return any(s in text for s in self.stop)


def reject_images(engine: RolloutEngine, images: Any) -> None:
    """Raise :class:`InvalidConfigError` if a text-only ``engine`` was given images."""
    if images and any(len(i) if isinstance(i, (list, tuple)) else 1 for i in images):
        raise InvalidConfigError(
            f"{type(engine).__name__} serves a text-only model but was given images; roll out "
            "a vision-language policy (a Qwen2-VL model) on image envs"
        )
