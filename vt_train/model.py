"""The tiny policy VT builds itself, its critic, and per-token logprobs.

No pretrained model can be downloaded in the quickstart, so the project makes
one: a small Qwen2-architecture causal LM over the default ``vt_envs``
tokenizer, randomly initialised from a seed, then warmed up by SFT
(:mod:`vt_train.sft`). It is saved in the Hugging Face layout, so
``AutoModelForCausalLM.from_pretrained`` and vLLM load it like any Qwen2.

Token-level convention (the whole trainer's): per-token tensors are
``[B, L]`` and aligned to tokens. Index ``t`` describes token ``t``; the
model's logprob of token ``t`` comes from the logits at position ``t - 1``,
so index 0 has logprob 0.
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

from vt_envs.core.tokenizer import DEFAULT_TOKENIZER_DIR, ChatTokenizer, load_tokenizer
from vt_envs.errors import InvalidConfigError
from vt_train.vision import is_vision_language, trunk_hidden

__all__ = [
    "CriticModel",
    "TinyModelConfig",
    "ValueHead",
    "build_tiny_model",
    "qwen2_config",
    "save_pretrained_with_tokenizer",
    "state_values",
    "token_logprobs",
]

# transformers 5 writes a chat template to its own file rather than tokenizer_config.json.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass
class TinyModelConfig:
    """Shape of the tiny Qwen2 policy.

    Attributes:
        hidden_size: model width.
        num_layers: transformer blocks.
        num_heads: attention heads; must divide ``hidden_size``.
        num_kv_heads: key/value heads (grouped-query attention); must divide
            ``num_heads``.
        intermediate_size: MLP width.
        max_position_embeddings: longest context (prompt + all turns).
        tie_word_embeddings: share the input embedding and the LM head
            (halves the parameters at this size, where the vocab dominates).
        rope_theta: RoPE base.
        seed: seeds the weight initialisation (the global RNG is left as it was).
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(
                    f"TinyModelConfig.{name} must be an int >= 1, got {value!r}"
                )
        if self.hidden_size % self.num_heads:
            raise InvalidConfigError(
                f"TinyModelConfig.num_heads={self.num_heads} must divide "
                f"hidden_size={self.hidden_size}; e.g. num_heads=4 for hidden_size=128"
            )
        if self.num_heads % self.num_kv_heads:
            raise InvalidConfigError(
                f"TinyModelConfig.num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads}"
            )


def qwen2_config(config: TinyModelConfig, tokenizer: ChatTokenizer) -> Qwen2Config:
    """The ``Qwen2Config`` for ``config`` over ``tokenizer``'s vocabulary."""
    return Qwen2Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_theta=config.rope_theta,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(config: TinyModelConfig, tokenizer: Any = None) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 causal LM sized by ``config``.

    ``tokenizer`` is anything :func:`vt_envs.load_tokenizer` accepts (``None``:
    the default 2048-id BPE); the vocabulary and eos/pad ids come from it.
    The same ``config.seed`` gives identical weights; the global torch RNG
    state is restored afterwards.
    """
    tok = load_tokenizer(tokenizer)
    hf_config = qwen2_config(config, tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(hf_config)
    model.config.vt_tiny_model = asdict(config)  # provenance, written into config.json
    return model.float().eval()


def _tokenizer_dir(tokenizer: Any) -> Path | None:
    if tokenizer is None:
        return DEFAULT_TOKENIZER_DIR
    if isinstance(tokenizer, (str, os.PathLike)):
        return Path(tokenizer)
    name = getattr(tokenizer, "name", None)  # a VTTokenizer remembers its directory
    if name == "vt-bpe-2048":
        return DEFAULT_TOKENIZER_DIR
    if isinstance(name, str) and Path(name, "tokenizer.json").is_file():
        return Path(name)
    return None


def save_pretrained_with_tokenizer(
    model: nn.Module,
    tokenizer: Any,
    path: str | os.PathLike[str],
    *,
    state_dict: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` and its tokenizer to ``path`` in the Hugging Face layout.

    The directory holds ``config.json``, ``generation_config.json``,
    ``model.safetensors`` and the tokenizer files, so
    ``AutoModelForCausalLM.from_pretrained(path)``,
    ``AutoTokenizer.from_pretrained(path)`` and vLLM load it. ``tokenizer``
    is ``None`` (the default tokenizer), a tokenizer directory, a
    :class:`~vt_envs.core.tokenizer.VTTokenizer` loaded from one, or a
    Hugging Face tokenizer (saved with its own ``save_pretrained``).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True, state_dict=state_dict)
    source = _tokenizer_dir(tokenizer)
    if source is not None:
        for name in _TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, path / name)
    elif hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(path)
    elif hasattr(getattr(tokenizer, "_tokenizer", None), "save_pretrained"):
        tokenizer._tokenizer.save_pretrained(path)  # an HFTokenizer adapter
    else:
        raise InvalidConfigError(
            f"cannot save tokenizer {tokenizer!r}: pass its directory, a VTTokenizer loaded "
            "from a directory, or a Hugging Face tokenizer"
        )
    return path


class ValueHead(nn.Module):
    """A linear map from hidden states ``[B, L, H]`` to values ``[B, L]``.

    Initialised to zero output (zero weight and bias), so a new critic
    predicts 0 everywhere and its first advantages equal the returns.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # In the head's own dtype (bf16 once DeepSpeed casts the critic), values out in fp32.
        dtype = self.summary.weight.dtype
        return self.summary(hidden_states.to(dtype)).squeeze(-1).float()


class CriticModel(nn.Module):
    """A causal LM's trunk plus a :class:`ValueHead`: per-token values for PPO.

    :meth:`forward` returns the head's raw output: ``out[b, t]`` has seen
    tokens ``0..t``, so it is the value of the state *after* token ``t``.
    The trainer needs ``V(s_t)``, the value of the state in which token ``t``
    was generated — the output at ``t - 1`` — so it calls
    :meth:`state_values`, which applies that shift (the same one as
    logprobs, and verl's ``values[:, -response_length - 1:-1]``).

    The trunk is any Hugging Face base model (``AutoModel``): Qwen2, Llama,
    Mistral, Gemma... or a vision-language one (``Qwen2VLModel``: vision tower
    and decoder), which then takes the batch's ``pixel_values`` and
    ``image_grid_thw`` too.
    """

    def __init__(self, trunk: nn.Module):
        super().__init__()
        self.trunk = trunk
        config = getattr(trunk.config, "text_config", None) or trunk.config
        self.value_head = ValueHead(config.hidden_size)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> CriticModel:
        """A critic whose trunk starts as a copy of ``policy``'s (the usual PPO init).

        ``policy`` is any Hugging Face causal LM (its ``get_decoder()`` is the
        trunk). Call it before the policy is handed to DeepSpeed: under ZeRO-3
        the policy's parameters are partitioned (empty) afterwards.
        """
        if is_vision_language(policy):  # the whole multimodal trunk: it must see the images
            return cls(copy.deepcopy(policy.model))
        decoder = policy.get_decoder() if hasattr(policy, "get_decoder") else None
        if decoder is None:
            raise InvalidConfigError(
                f"CriticModel.from_policy needs a causal LM with get_decoder(); got "
                f"{type(policy).__name__}"
            )
        return cls(copy.deepcopy(decoder))

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], dtype: torch.dtype = torch.float32
    ) -> CriticModel:
        """A critic whose trunk is loaded from a local model directory (``AutoModel``, in
        ``dtype``; inside :func:`~vt_train.ds_engine.zero3_construction`: partitioned)."""
        from transformers import AutoModel

        return cls(AutoModel.from_pretrained(str(path), local_files_only=True, dtype=dtype))

    @classmethod
    def from_config(cls, config: TinyModelConfig, tokenizer: Any = None) -> CriticModel:
        """A freshly initialised critic sized by ``config``."""
        tok = load_tokenizer(tokenizer)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            trunk = Qwen2Model(qwen2_config(config, tok))
        return cls(trunk)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if is_vision_language(self.trunk):
            hidden = trunk_hidden(
                self.trunk,
                input_ids,
                attention_mask,
                pixel_values=pixel_values,
                image_grid_thw=image_grid_thw,
            )
        else:
            hidden = self.trunk(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
        return self.value_head(hidden)


def state_values(
    critic: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    **vision: torch.Tensor,
) -> torch.Tensor:
    """``V(s_t)`` for every token ``t``, ``[B, L]`` float32, token-aligned.

    Index ``t`` is the critic's output at position ``t - 1``: the value of the
    state in which token ``t`` was generated, before the critic has seen it.
    Index 0 (no state before the first token) is 0. ``critic`` is a
    :class:`CriticModel` or anything wrapping one (a DeepSpeed engine);
    ``vision`` holds the batch's ``pixel_values`` / ``image_grid_thw``.
    """
    after = critic(input_ids, attention_mask, **vision).float()
    return torch.nn.functional.pad(after[:, :-1], (1, 0))


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    only: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` of each token given the tokens before it.

    Returns ``[B, L]`` float32 aligned to ``input_ids``: index ``t`` holds
    ``log p(token_t | tokens_<t)`` computed from the logits at ``t - 1``;
    index 0, and every position where ``attention_mask`` is 0, holds 0.
    Sequences are right-padded (padding after the last real token).

    ``only`` (``[B, L]``, e.g. the loss mask) restricts the work to positions
    where it is nonzero; the others hold 0. The LM head then runs on those
    positions only, which on short agent turns after a long prompt saves most
    of a tiny model's compute. ``model`` must then expose ``get_decoder`` and
    ``get_output_embeddings`` (every Hugging Face causal LM does).
    """
    if temperature <= 0:
        raise InvalidConfigError(
            f"token_logprobs needs temperature > 0 (the sampling distribution), got {temperature}"
        )
    targets = input_ids[:, 1:]
    if only is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, :-1].float() / temperature
        # logit - logsumexp: no [B, L, V] log-prob copy
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        out = torch.nn.functional.pad(picked - torch.logsumexp(logits, dim=-1), (1, 0))
    else:
        hidden = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        )
        where = only[:, 1:] != 0
        logits = model.get_output_embeddings()(hidden.last_hidden_state[:, :-1][where])
        logits = logits.float() / temperature
        picked = logits.gather(-1, targets[where].unsqueeze(-1)).squeeze(-1)
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        out[:, 1:][where] = picked - torch.logsumexp(logits, dim=-1)
    if attention_mask is not None:
        out = out * attention_mask.to(out.dtype)
    return out
