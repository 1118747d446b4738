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

Files are JSONL, JSON or Parquet (read with DuckDB), or the original MATH
release's tree of one problem per JSON file (``MATH/train/algebra/1.json``
with ``problem``/``level``/``type``/``solution``; a directory, or one such
file). Metadata keeps the fields worth grouping results by (``level``,
``subject``/``type``, ``difficulty``, ``year``...) and ``source``; never the gold.

Splits are real, never a label. ``split="train"`` and ``split="test"`` of the
same data are disjoint and together make all of it:

1. data with its own split — a ``split`` field on every record (ToRL/verl:
   ``extra_info.split``), or a MATH tree's ``train/`` and ``test/``
   directories — keeps the records of the asked
   split (refused with :class:`DatasetFormatError` if it has none);
2. otherwise a record is in the test split iff a seeded SHA-256 of its prompt
   falls in the first ``holdout`` fraction of the hash space (default
   :data:`DEFAULT_HOLDOUT` = 10%; ``holdout_seed`` redraws it). The same prompt
   always lands on the same side, so a duplicated question cannot leak.
   ``holdout=1.0`` takes a whole file as test data (a benchmark such as
   MATH500 or AIME), ``holdout=0.0`` as train data; the empty side is refused.

Optional PyPI data packages load when installed: :func:`load_champ` reads
CHAMP (``pip install champ-dataset``, MIT licence). Nothing is vendored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from vt_envs.core.loaders import FieldMap, load_tasks, read_records
from vt_envs.core.task import SPLITS, Task, TaskList
from vt_envs.domains.math.verifier import last_boxed
from vt_envs.errors import DatasetFormatError, InvalidConfigError

__all__ = [
    "DEFAULT_HOLDOUT",
    "LAYOUTS",
    "detect_layout",
    "gsm8k_gold",
    "holdout_split",
    "load_champ",
    "load_competition",
    "load_deepmath",
    "load_gsm8k",
    "load_math",
    "load_math_dataset",
    "math_gold",
]

LAYOUTS = ("gsm8k", "math", "deepmath", "verl", "qa")
DEFAULT_HOLDOUT = 0.1
"""The fraction of user data held out as the test split when it has no split of its own."""
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


def holdout_split(prompt: str, holdout: float = DEFAULT_HOLDOUT, seed: int = 0) -> str:
    """``"test"`` iff the SHA-256 of ``(seed, prompt)`` falls in the first ``holdout``
    fraction of the hash space, else ``"train"``: stable on every machine."""
    digest = hashlib.sha256(f"vt-math-split/{seed}/{prompt}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") < holdout * 2**64 else "train"


def _read_tree(root: Path) -> list[dict[str, Any]]:
    """The MATH release's tree: one problem per ``.json`` file. Each record gets an
    ``id`` (its path under ``root``, no suffix) and, under a ``train``/``test``
    directory, that ``split``."""
    files = sorted(p for p in root.rglob("*.json") if p.is_file())
    if not files:
        raise DatasetFormatError(f"{root}: a directory dataset needs *.json files; found none")
    records = []
    for path in files:
        record = _read_one_object(path)
        rel = path.relative_to(root).with_suffix("")
        dirs = [root.name, *rel.parts[:-1]]
        record.setdefault("id", f"{root.name}/{rel.as_posix()}")
        split = next((d for d in reversed(dirs) if d in SPLITS), None)
        if split is not None and "split" not in _lower_keys(record):
            record["split"] = split
        records.append(record)
    return records


def _read_one_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetFormatError(f"{path}: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise DatasetFormatError(f"{path}: a one-problem file must hold a JSON object")
    return dict(data)


def _read_source(path: Path, format: str | None) -> list[dict[str, Any]]:
    """Records of a file, or of a directory tree of one-problem JSON files."""
    if path.is_dir():
        return _read_tree(path)
    if (format or path.suffix.lstrip(".").lower()) == "json" and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None  # read_records names the error
        if isinstance(data, Mapping) and not any(isinstance(v, list) for v in data.values()):
            return [dict(data)]  # one problem per file (the MATH release)
    return read_records(path, format=format)


def _own_split(record: Mapping[str, Any]) -> str | None:
    """A record's own split: its ``split`` field, or (ToRL/verl) ``extra_info.split``."""
    record = _lower_keys(record)
    value = record.get("split")
    extra = record.get("extra_info")
    if value is None and isinstance(extra, Mapping):
        value = extra.get("split")
    return None if value is None else str(value).strip().lower()


def _select_split(
    tasks: list[Task],
    records: list[Mapping[str, Any]],
    *,
    name: str,
    split: str,
    holdout: float,
    seed: int,
) -> list[Task]:
    """The tasks of ``split``: by the data's own split when every record has one,
    else by :func:`holdout_split` of the prompt. Refuses an empty result."""
    own = [_own_split(r) for r in records]
    if all(s is not None for s in own):
        kept = [t for t, s in zip(tasks, own) if s == split]
        if not kept:
            raise DatasetFormatError(
                f"{name}: the data's own split field holds {sorted(set(map(str, own)))}, no "
                f"{split!r} record; ask for one of those (train/test), or drop the field to "
                f"split by holdout="
            )
        return kept
    kept = [t for t in tasks if holdout_split(t.prompt, holdout, seed) == split]
    if not kept:
        raise DatasetFormatError(
            f"{name}: the {split!r} split is empty: holdout={holdout} puts "
            f"{'every' if split == 'train' else 'no'} one of its {len(tasks)} records in the "
            "test split. Use holdout=1.0 with split='test' for a file that is all test data "
            "(a benchmark), holdout=0.0 with split='train' for training data, or a fraction "
            "in between to hold part out"
        )
    return kept


def load_math_dataset(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    layout: str | None = None,
    fields: FieldMap | None = None,
    name: str | None = None,
    split: str = "test",
    holdout: float = DEFAULT_HOLDOUT,
    holdout_seed: int = 0,
    format: str | None = None,
    limit: int | None = None,
) -> TaskList:
    """Load the ``split`` of math tasks from a file, a MATH tree or records, of any known layout.

    Args:
        source: a JSONL/JSON/Parquet file, a directory of one-problem JSON files
            (the MATH release), or an iterable of records.
        layout: one of :data:`LAYOUTS`; ``None`` detects it from the first record.
        fields: a :class:`FieldMap` for any other layout (overrides ``layout``);
            its ``gold_transform`` may be :func:`gsm8k_gold`.
        name: the source name in task ids (``"{name}/{split}/{index}"``, ``index``
            the record's place in the whole file, unless the records carry ids);
            default: the file's stem, else ``"math"``.
        split: ``"train"`` or ``"test"``: the data's own split if every record
            has a ``split`` field (or a MATH tree's directory), else the hash
            split of the module docstring. An empty split raises
            :class:`DatasetFormatError` saying which ``holdout`` to use.
        holdout: the test fraction of the hash split (0 … 1; default 0.1).
        holdout_seed: reseeds the hash split (another disjoint partition).
        format: the file format (default: from the suffix).
        limit: at most this many tasks of the split (the first in file order).
    """
    if split not in SPLITS:
        raise InvalidConfigError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 <= float(holdout) <= 1.0:
        raise InvalidConfigError(
            f"holdout is the test fraction, between 0 and 1; got {holdout!r} "
            "(1.0: the whole file is test data, 0.0: all train)"
        )
    if name is None:
        name = (
            os.path.splitext(os.path.basename(os.path.normpath(os.fspath(source))))[0]
            if isinstance(source, (str, os.PathLike))
            else "math"
        )
    if isinstance(source, (str, os.PathLike)):
        if not os.path.exists(source):
            raise DatasetFormatError(f"dataset {os.fspath(source)!r} does not exist")
        records = _read_source(Path(source), format)
    else:
        records = [dict(r) for r in source]
    if not records:
        raise DatasetFormatError(f"{name}: the dataset holds no records")
    if fields is not None:
        tasks = list(load_tasks(records, fields, name=name, split=split))
    else:
        tasks = list(_tasks_of_layout(records, layout, name=name, split=split))
    kept = _select_split(
        tasks, records, name=name, split=split, holdout=float(holdout), seed=holdout_seed
    )
    return TaskList(kept[:limit] if limit is not None else kept, name=name, split=split)


def _tasks_of_layout(
    records: list[dict[str, Any]], layout: str | None, *, name: str, split: str
) -> TaskList:
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
    path: str | os.PathLike[str],
    *,
    split: str = "test",
    holdout: float = DEFAULT_HOLDOUT,
    limit: int | None = None,
) -> TaskList:
    """GSM8K JSONL/Parquet (``question``, ``answer`` ending ``#### N``); ``split`` and
    ``holdout`` as in :func:`load_math_dataset` (``holdout=1.0``: the file is all test)."""
    return load_math_dataset(
        path, layout="gsm8k", name="gsm8k", split=split, holdout=holdout, limit=limit
    )


def load_math(
    path: str | os.PathLike[str],
    *,
    name: str = "math",
    split: str = "test",
    holdout: float = DEFAULT_HOLDOUT,
    limit: int | None = None,
) -> TaskList:
    """MATH or MATH500 (``problem``, ``solution`` with ``\\boxed{}``, optional ``answer``)."""
    return load_math_dataset(
        path, layout="math", name=name, split=split, holdout=holdout, limit=limit
    )


def load_competition(
    path: str | os.PathLike[str],
    *,
    name: str = "aime",
    split: str = "test",
    holdout: float = DEFAULT_HOLDOUT,
    limit: int | None = None,
) -> TaskList:
    """AIME/AMC-style files (``problem`` or ``question``, ``answer``; any capitalisation)."""
    return load_math_dataset(
        path, layout="qa", name=name, split=split, holdout=holdout, limit=limit
    )


def load_deepmath(
    path: str | os.PathLike[str],
    *,
    name: str = "deepmath",
    split: str = "train",
    holdout: float = DEFAULT_HOLDOUT,
    fields: FieldMap | None = None,
    limit: int | None = None,
) -> TaskList:
    """DeepMath-103K (``question``/``final_answer``) or ToRL/verl Parquet
    (``prompt`` messages, ``reward_model.ground_truth``), detected per file;
    ``fields`` overrides for other column names."""
    return load_math_dataset(
        path, fields=fields, name=name, split=split, holdout=holdout, limit=limit
    )


def load_champ(
    *,
    version: str = "v0",
    split: str = "test",
    holdout: float = DEFAULT_HOLDOUT,
    limit: int | None = None,
) -> TaskList:
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
    return load_math_dataset(
        rows, layout="qa", name="champ", split=split, holdout=holdout, limit=limit
    )
