"""Load a model for ZeRO-3 so that no rank ever holds all of it.

``transformers``' own ZeRO-3 path (``from_pretrained`` under an
``HfDeepSpeedConfig``) builds the model partitioned but reads the whole
checkpoint into a state dict on *every* rank first: measured here, two ranks
loading SmolLM2 (513 MB in fp32) each held 512-541 MB of private memory right
after the load, more than a plain load whose tensors stay views of the
memory-mapped file (179 MB).

:func:`load_partitioned` instead builds the model from its ``config.json``
under ``deepspeed.zero.Init`` (each rank allocates only its shards), then
fills it one parameter at a time: the parameter is gathered, rank 0 reads
that one tensor from the memory-mapped safetensors file and writes it in, and
leaving the gather re-partitions it (the other ranks receive their shards and
read nothing). A rank's private memory is its shards plus one tensor.

It covers models whose parameter names are the checkpoint's (causal LMs, and
their trunks for a critic: ``base=True`` matches names under the model's
``base_model_prefix``). For any other layout (a vision-language checkpoint
whose names ``transformers`` converts on load) it returns ``None`` before
reading anything, and the caller falls back to ``transformers``' path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["checkpoint_index", "load_partitioned"]


def checkpoint_index(path: str | Path) -> dict[str, Path] | None:
    """Checkpoint tensor name -> the safetensors file holding it (``None`` if the
    directory has no safetensors weights)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    single = path / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def load_partitioned(
    path: str | Path, *, dtype: torch.dtype, ds_config: dict[str, Any], base: bool = False
) -> nn.Module | None:
    """The model in directory ``path`` (``base``: its trunk, ``AutoModel``), in
    ``dtype`` (which ``ds_config``'s ``bf16`` section must match), built partitioned
    under ``deepspeed.zero.Init(ds_config)`` and filled as the module docstring says;
    ``None`` when its names do not match the checkpoint's (nothing is read then)."""
    import torch.distributed as dist
    import transformers

    from vt_train.ds_engine import init_distributed_env

    deepspeed = init_distributed_env()
    index = checkpoint_index(path)
    if index is None:
        return None
    config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    if getattr(config, "vision_config", None) is not None:
        return None  # names converted on load: transformers' own path
    from transformers.initialization import no_init_weights

    auto = transformers.AutoModel if base else transformers.AutoModelForCausalLM
    # No random init: every parameter is overwritten below, and transformers' init
    # functions cannot run on ZeRO-3's empty placeholders. The dtype comes from the
    # config's bf16 section: zero.Init's own dtype argument is ignored on accelerators
    # without fp16 (the CPU), which then get bf16.
    with deepspeed.zero.Init(config_dict_or_path=ds_config), no_init_weights():
        model = auto.from_config(config, dtype=dtype)
    model.tie_weights()  # a tied head shares the embedding's (partitioned) parameter
    names = _checkpoint_names(model, index)
    if names is None:
        return None
    rank = dist.get_rank()
    readers: dict[Path, Any] = {}
    try:
        for name, param in model.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0), torch.no_grad():
                if rank == 0:
                    param.data.copy_(_read(readers, index, names[name]))
        for name, buffer in model.named_buffers():
            key = names.get(name)
            if key is not None:  # persistent buffers: whole on every rank
                with torch.no_grad():
                    buffer.copy_(_read(readers, index, key))
    finally:
        readers.clear()
    return model.eval()


def _read(readers: dict[Path, Any], index: dict[str, Path], key: str) -> torch.Tensor:
    from safetensors import safe_open

    file = index[key]
    if file not in readers:
        readers[file] = safe_open(str(file), framework="pt")
    return readers[file].get_tensor(key)


def _checkpoint_names(model: nn.Module, index: dict[str, Path]) -> dict[str, str] | None:
    """Model parameter / buffer name -> checkpoint name, or ``None`` if some parameter
    has none (tied weights may be missing: they are tied after the load)."""
    prefix = getattr(model, "base_model_prefix", "")
    tied = _tied_names(model)
    names: dict[str, str] = {}
    for name, _ in [*model.named_parameters(), *model.named_buffers()]:
        for key in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")):
            if key in index:
                names[name] = key
                break
    missing = [n for n, _ in model.named_parameters() if n not in names and n not in tied]
    if missing:
        return None
    for name in tied:  # filled through the weight it shares
        names.setdefault(name, names.get(tied[name], ""))
    return names


def _tied_names(model: nn.Module) -> dict[str, str]:
    """Second name -> first name of parameters that are one tensor (a tied head)."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied
