"""The closed-book check of VT-Search-v0: which held-out questions a real model
answers from the question alone (no tool, no passages), for the default corpus.

    python scripts/search_closed_book.py [--split test] [--model smollm2-135m-instruct]

Runs SmolLM2-135M-Instruct greedily (HF engine, CPU, batched; chunks are saved
under the cache directory, so an interrupted run resumes) on every
generated ``split`` candidate, before the retrieval filter, and writes the
ids it answers — its answer holds a gold on word boundaries after SQuAD
normalization (``substring_em``, stricter for the benchmark than exact match)
— to ``vt_envs/assets/search/closed_book.json``. The env drops those tasks, so
users do not need the model. Prints the model's exact-match and substring
accuracy per kind, on all candidates and on the env's retrievable set.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import time
from pathlib import Path

from vt_envs.core.packaged_models import resolve_model
from vt_envs.domains.search import vital_articles_corpus
from vt_envs.domains.search.index import cache_dir
from vt_envs.domains.search.tasks import (
    CLOSED_BOOK_FILE,
    GENERATOR_VERSION,
    RETRIEVAL_FILE,
    candidate_tasks,
    candidates_digest,
    shipped_filter,
)
from vt_envs.domains.search.verifier import exact_match, substring_match

OUT = Path(__file__).resolve().parent.parent / "vt_envs" / "assets" / "search" / CLOSED_BOOK_FILE
SYSTEM = "Answer the question from memory. Reply with the answer only, in a few words."


def _engine(model: str, batch: int):
    from vt_train.engines.hf import HFEngine

    directory = resolve_model(model, dtype="float32")
    return HFEngine(directory, directory, max_batch_size=batch)


def _answers(engine, questions: list[str]) -> list[str]:
    """Greedy answers to ``questions``, one batched call of the HF engine."""
    from vt_train.engines.base import SamplingParams

    tok = engine.tokenizer
    params = SamplingParams(max_new_tokens=24, temperature=0.0, stop=("\n",))
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                add_generation_prompt=True,
            )
        )
        for q in questions
    ]

    async def run() -> list[str]:
        outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        return [re.sub(r"<\|[^|]*\|>", "", tok.decode(o.token_ids)).strip() for o in outs]

    return asyncio.run(run())


def _answer_all(model: str, candidates: list, batch: int, progress: Path) -> dict[str, str]:
    """Every candidate's answer, shortest question first, in chunks of ``batch`` (each
    chunk's answers are saved to ``progress``, so an interrupted run resumes)."""
    done: dict[str, str] = json.loads(progress.read_text()) if progress.is_file() else {}
    todo = sorted((c for c in candidates if c.id not in done), key=lambda c: len(c.question))
    engine = _engine(model, batch) if todo else None
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        done.update(zip((c.id for c in chunk), _answers(engine, [c.question for c in chunk])))
        progress.write_text(json.dumps(done))
        print(f"{len(done)}/{len(candidates)} answered", file=sys.stderr, flush=True)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="first N only (no file written)")
    args = parser.parse_args()
    corpus = vital_articles_corpus()
    candidates = candidate_tasks(corpus)
    mine = [c for c in candidates if c.split == args.split][: args.limit]
    start = time.perf_counter()
    progress = cache_dir() / f"closed_book-{args.model}-{candidates_digest(mine)}.json"
    done = _answer_all(args.model, mine, args.batch, progress)
    answers = [done[c.id] for c in mine]
    seconds = time.perf_counter() - start
    entry = shipped_filter(RETRIEVAL_FILE, corpus, candidates, args.split)
    dropped = {f"search/{args.split}/{k}" for k in entry["dropped"]} if entry else set()
    by_kind: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    answered = []
    for c, answer in zip(mine, answers):
        em, sub = exact_match(answer, c.golds), substring_match(answer, c.golds)
        for scope in ("all", "retrievable") if c.id not in dropped else ("all",):
            by_kind[scope][f"{c.kind}/em"].append(em)
            by_kind[scope][f"{c.kind}/substring"].append(sub)
            by_kind[scope]["all/em"].append(em)
            by_kind[scope]["all/substring"].append(sub)
        if sub:
            answered.append(c)
            print(f"answered {c.kind}: {answer!r} (golds {list(c.golds)[:3]})")
    report = {
        scope: {k: [len(v), round(sum(v) / len(v), 4)] for k, v in sorted(parts.items())}
        for scope, parts in by_kind.items()
    }
    print(json.dumps({"seconds": round(seconds, 1), "prompts": len(mine), **report}, indent=1))
    if args.limit is not None:
        return
    data = json.loads(OUT.read_text()) if OUT.is_file() else {}
    if data.get("generator_version") != GENERATOR_VERSION or data.get("corpus") != (
        corpus.content_hash
    ):
        data = {"splits": {}}
    data.update(
        what="VT-Search-v0 candidates a closed-book model answers (kind/key), per split",
        generator_version=GENERATOR_VERSION,
        corpus=corpus.content_hash,
        model=args.model,
        decoding="greedy, max_new_tokens=24, stop at newline; answered = substring_em",
        system_prompt=SYSTEM,
    )
    data["splits"][args.split] = {
        "candidates": len(mine),
        "candidates_digest": candidates_digest(mine),
        "seconds": round(seconds, 1),
        "accuracy": report,
        "answered": sorted(c.id.removeprefix(f"search/{args.split}/") for c in answered),
    }
    OUT.write_text(json.dumps(data, indent=0) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
