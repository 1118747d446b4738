"""Loaders for the math datasets users bring: GSM8K, MATH/MATH500, AIME/AMC, DeepMath, ToRL.

All build on :func:`vt_envs.core.loaders.load_tasks` and its :class:`FieldMap`.
:func:`load_math_dataset` recognises each layout from the first record's
fields (or takes a ``FieldMap`` that overrides the guess):

===================  ==========================================  ======================
layout               fields                                       gold
===================  ==========================================  ======================
``gsm8k``            ``question``, ``answer`` ending ``#### N``   ``N`` (commas removed)
``math``             ``problem``, ``solution`` (+ ``answer``)     ``answer``, else the last
                                                                  ``\\boxed{}`` of ``solution``
``deepmath``         ``question``, ``final_answer``               ``final_answer``
``verl``             ``prompt`` (chat messages), ``reward_model``  ``reward_model.ground_truth``
                     (ToRL / verl Parquet)
``qa``               ``problem`` or ``question``, ``answer``      ``answer``
                     (AIME/AMC JSONL; field names any case)
===================  ==========================================  ======================

Files are JSONL, JSON or Parquet (read with DuckDB). Metadata keeps the
fields worth grouping results by (``level``, ``subject``/``type``,
``difficulty``, ``year``...) and ``source``; never the gold.

Optional PyPI data packages load when installed: :func:`load_champ` reads
CHAMP (``pip install champ-dataset``, MIT licence). Nothing is vendored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from vt_envs.core.loaders import FieldMap, load_tasks, read_records
from vt_envs.core.task import TaskList
from vt_envs.domains.math.verifier import last_boxed
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = [
    "LAYOUTS",
    "detect_layout",
    "gsm8k_gold",
    "load_champ",
    "load_competition",
    "load_deepmath",
    "load_gsm8k",
    "load_math",
    "load_math_dataset",
    "math_gold",
]

LAYOUTS = ("gsm8k", "math", "deepmath", "verl", "qa")
_METADATA_FIELDS = (
    "level",
    "subject",
    "type",
    "difficulty",
    "topic",
    "year",
    "source",
    "data_source",
    "url",
    "contest",
)
_ID_FIELDS = ("unique_id", "id", "idx", "problem_id")


def gsm8k_gold(answer: Any) -> str:
    """The final answer of a GSM8K solution: the text after the last ``####``,
    without thousands separators (``"... #### 1,200"`` → ``"1200"``)."""
    text = str(answer)
    if "####" not in text:
        raise DatasetFormatError(
            f"a GSM8K answer must end with '#### N', got {text[-80:]!r}; "
            "use layout='qa' for files whose answer is already final"
        )
    final = text.rsplit("####", 1)[1].strip()
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", final)


def math_gold(record: Mapping[str, Any]) -> str:
    """A MATH record's gold: its ``answer`` field (MATH500) or else the last
    ``\\boxed{}`` of its ``solution`` (the original MATH release)."""
    answer = record.get("answer")
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    boxed = last_boxed(str(record.get("solution", "")))
    if boxed is None:
        raise DatasetFormatError(
            "a MATH record needs an 'answer' field or a \\boxed{} answer in its 'solution'; "
            f"got fields {sorted(record)}"
        )
    return boxed.strip()


def _lower_keys(record: Mapping[str, Any]) -> dict[str, Any]:
    """Field names in lower case (AIME files often use ``Problem``/``Answer``/``ID``)."""
    return {str(k).lower(): v for k, v in record.items()}


def detect_layout(record: Mapping[str, Any]) -> str:
    """The layout of a dataset from one (lower-cased) record; see the module table."""
    keys = set(record)
    if "reward_model" in keys and "prompt" in keys:
        return "verl"
    if "final_answer" in keys and ("question" in keys or "problem" in keys):
        return "deepmath"
    if "problem" in keys and "solution" in keys:
        return "math"
    if "question" in keys and "answer" in keys and "####" in str(record["answer"]):
        return "gsm8k"
    if ("problem" in keys or "question" in keys) and "answer" in keys:
        return "qa"
    raise DatasetFormatError(
        f"cannot tell the layout of records with fields {sorted(keys)}; expected one of "
        f"{list(LAYOUTS)} (see vt_envs.domains.math.loaders) or pass fields=FieldMap(...)"
    )


def _verl_prompt(record: Mapping[str, Any]) -> str:
    """The question of a verl record: the last user message of its chat ``prompt``."""
    prompt = record["prompt"]
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise DatasetFormatError(f"a verl 'prompt' must hold a user message, got {prompt!r:.200}")
    return str(users[-1]["content"])


def _verl_gold(reward_model: Any) -> str:
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise DatasetFormatError(
            f"a verl 'reward_model' must hold 'ground_truth', got {reward_model!r:.200}"
        )
    truth = reward_model["ground_truth"]
    if isinstance(truth, (list, tuple)):  # some exports keep several accepted forms
        truth = truth[0]
    return str(truth)


def _normalise(record: Mapping[str, Any], layout: str) -> dict[str, Any]:
    """One record in the common shape ``{"prompt", "gold", metadata..., "id"?}``."""
    record = _lower_keys(record)
    if layout == "gsm8k":
        out = {"prompt": record["question"], "gold": gsm8k_gold(record["answer"])}
    elif layout == "math":
        out = {"prompt": record["problem"], "gold": math_gold(record)}
    elif layout == "deepmath":
        out = {
            "prompt": record.get("question", record.get("problem")),
            "gold": str(record["final_answer"]),
        }
    elif layout == "verl":
        out = {"prompt": _verl_prompt(record), "gold": _verl_gold(record["reward_model"])}
    elif layout == "qa":
        out = {
            "prompt": record.get("problem", record.get("question")),
            "gold": str(record["answer"]).strip(),
        }
    else:
        raise InvalidConfigError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    for key in _METADATA_FIELDS:
        value = record.get(key)
        if isinstance(value, Decimal):  # DuckDB reads Parquet decimals as Decimal
            value = float(value)
        if isinstance(value, (str, int, float, bool)):
            out[key] = value
    extra = record.get("extra_info")
    if layout == "verl" and isinstance(extra, Mapping) and extra.get("index") is not None:
        out["id"] = f"{record.get('data_source', 'verl')}/{extra['index']}"
    for key in _ID_FIELDS:
        if record.get(key) is not None and "id" not in out:
            out["id"] = str(record[key])
    return out


def load_math_dataset(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    layout: str | None = None,
    fields: FieldMap | None = None,
    name: str | None = None,
    split: str = "test",
    format: str | None = None,
    limit: int | None = None,
) -> TaskList:
    """Load math tasks from a JSONL/JSON/Parquet file (or records) of any known layout.

    Args:
        source: a file path, or an iterable of records.
        layout: one of :data:`LAYOUTS`; ``None`` detects it from the first record.
        fields: a :class:`FieldMap` for any other layout (overrides ``layout``);
            its ``gold_transform`` may be :func:`gsm8k_gold`.
        name: the source name in task ids (``"{name}/{split}/{index}"`` unless
            the records carry ids); default: the file's stem, else ``"math"``.
        split, format, limit: as in :func:`vt_envs.core.loaders.load_tasks`.
    """
    if name is None:
        name = (
            os.path.splitext(os.path.basename(os.fspath(source)))[0]
            if isinstance(source, (str, os.PathLike))
            else "math"
        )
    if fields is not None:
        return load_tasks(source, fields, name=name, split=split, format=format, limit=limit)
    records = (
        read_records(source, format=format)
        if isinstance(source, (str, os.PathLike))
        else list(source)
    )
    if limit is not None:
        records = records[:limit]
    if not records:
        raise DatasetFormatError(f"{name}: the dataset holds no records")
    layout = layout or detect_layout(_lower_keys(records[0]))
    rows = [_normalise(r, layout) for r in records]
    have_ids = all("id" in r for r in rows) and len({r["id"] for r in rows}) == len(rows)
    metadata = sorted({k for r in rows for k in r} - {"prompt", "gold", "id", "source"})
    for r in rows:
        r["source"] = r.get("source") or name
        for key in metadata:
            r.setdefault(key, None)
        r["layout"] = layout
    field_map = FieldMap(
        prompt="prompt",
        gold="gold",
        id="id" if have_ids else None,
        metadata=(*metadata, "layout", "source"),
    )
    return load_tasks(rows, field_map, name=name, split=split)


def load_gsm8k(
    path: str | os.PathLike[str], *, split: str = "test", limit: int | None = None
) -> TaskList:
    """GSM8K JSONL/Parquet (``question``, ``answer`` ending ``#### N``)."""
    return load_math_dataset(path, layout="gsm8k", name="gsm8k", split=split, limit=limit)


def load_math(
    path: str | os.PathLike[str],
    *,
    name: str = "math",
    split: str = "test",
    limit: int | None = None,
) -> TaskList:
    """MATH or MATH500 (``problem``, ``solution`` with ``\\boxed{}``, optional ``answer``)."""
    return load_math_dataset(path, layout="math", name=name, split=split, limit=limit)


def load_competition(
    path: str | os.PathLike[str],
    *,
    name: str = "aime",
    split: str = "test",
    limit: int | None = None,
) -> TaskList:
    """AIME/AMC-style files (``problem`` or ``question``, ``answer``; any capitalisation)."""
    return load_math_dataset(path, layout="qa", name=name, split=split, limit=limit)


def load_deepmath(
    path: str | os.PathLike[str],
    *,
    name: str = "deepmath",
    split: str = "train",
    fields: FieldMap | None = None,
    limit: int | None = None,
) -> TaskList:
    """DeepMath-103K (``question``/``final_answer``) or ToRL/verl Parquet
    (``prompt`` messages, ``reward_model.ground_truth``), detected per file;
    ``fields`` overrides for other column names."""
    return load_math_dataset(path, fields=fields, name=name, split=split, limit=limit)


def load_champ(*, version: str = "v0", split: str = "test", limit: int | None = None) -> TaskList:
    """CHAMP (270 competition problems, MIT licence) from the optional ``champ-dataset`` package.

    Raises:
        DatasetFormatError: the package is not installed (the message says how to install it).
    """
    try:
        import champ_dataset
    except ImportError:
        raise DatasetFormatError(
            "CHAMP needs the optional package: pip install 'champ-dataset>=1,<2'"
        ) from None
    dataset = champ_dataset.load(version)
    rows = [
        {
            "id": f"champ/{p.identifier}",
            "problem": p.text,
            "answer": p.answer,
            "subject": p.category,
            "source": "champ",
        }
        for p in dataset.problems.values()
    ]
    return load_math_dataset(rows, layout="qa", name="champ", split=split, limit=limit)
