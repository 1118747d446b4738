"""``vt-bench view DIR [--out FILE.html]``: one self-contained HTML page of an eval or a run.

``DIR`` is either an evaluation (``vt-bench eval --out``: ``rollouts.jsonl`` or
``rollouts.jsonl.gz``) or a training run directory (``vt-train``: its
``transcripts/*.txt``, ``config.yaml`` naming the env). The page (default
``DIR/view.html``) holds: a summary table by env and by task kind (family),
computed from every rollout read; filters; and each embedded rollout's
transcript turn by turn: the action the policy wrote with its token counts
(read new / written), the tool call it made (ok or the error) and what came
back, images inline (a record's ``images``: PNG/JPEG data URLs, in the order
of the transcript's ``<image>`` placeholders; eval records keep none, and
``--images`` rebuilds them by replaying the rollouts, see
:mod:`vt_bench.view_images`). CSS and script are inline; no file or network
is fetched when the page is opened.

Transcripts are model-written, so every string is HTML-escaped where it is
written, and the page's script never parses markup (see :mod:`vt_bench.view_page`
for the filter, which is driven by the URL fragment:
``view.html#env=VT-Math-v0&solved=0``).

Examples::

    vt-bench view docs/eval/oracle                      # -> docs/eval/oracle/view.html
    vt-bench view docs/eval/smollm2 --out /tmp/s.html   # rollouts.jsonl.gz
    vt-bench view docs/eval/oracle --images             # VT-Visual-v0's images, replayed
    vt-bench view runs/quickstart/rl --max-rollouts 0   # a run's transcripts, all of them
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from vt_bench import view_page
from vt_bench.view_render import DEFAULT_MAX_CHARS, render_rollout, tokens
from vt_envs.errors import InvalidConfigError

__all__ = ["add_arguments", "build_page", "from_record", "load", "main", "summary_rows"]

DEFAULT_MAX_ROLLOUTS = 500

_HEADER = re.compile(
    r"^===== task (?P<task>.*?) \| reward (?P<reward>\S+) \| turns (?P<turns>\d+) "
    r"\| tool calls (?P<calls>\d+) =====$",
    re.M,
)
_DATA_URL = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="an eval directory (rollouts.jsonl[.gz]) or a run directory")
    parser.add_argument("--out", default=None, help="the HTML file (default: DIR/view.html)")
    parser.add_argument(
        "--max-rollouts", type=int, default=DEFAULT_MAX_ROLLOUTS,
        help=f"rollouts embedded, taken in turn from each env (default {DEFAULT_MAX_ROLLOUTS}; "
        "0: all); the summary counts every rollout",
    )  # fmt: skip
    parser.add_argument(
        "--env", action="append", default=[], metavar="ENV_ID",
        help="only this env id's rollouts, in the summary and the page (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--images", action="store_true",
        help="an eval's images: replay the embedded rollouts that show <image> (their env "
        "ids built with config.json's keywords) and embed the images; a replay ending with "
        "another reward is dropped",
    )  # fmt: skip
    parser.add_argument(
        "--image-side", type=int, default=512, help="longest side of an embedded image (px)"
    )
    parser.add_argument(
        "--max-chars", type=int, default=DEFAULT_MAX_CHARS,
        help=f"characters kept of each text block, head and tail (default {DEFAULT_MAX_CHARS}; "
        "0: all)",
    )  # fmt: skip


def main(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    out = Path(args.out) if args.out else directory / "view.html"
    rollouts, source = load(directory)
    if args.env:
        rollouts = [r for r in rollouts if r["env"] in set(args.env)]
        if not rollouts:
            raise InvalidConfigError(f"{directory}: no rollout of {args.env}")
    if args.images:
        from vt_bench.view_images import replay_images

        replayed = replay_images(
            directory, _pick(rollouts, args.max_rollouts), side=args.image_side
        )
        print(f"--images: {replayed} rollouts replayed for their images")
    html = build_page(
        rollouts, title=f"VT view: {directory}", source=source,
        max_rollouts=args.max_rollouts, max_chars=args.max_chars,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    shown = len(_pick(rollouts, args.max_rollouts))
    print(f"Wrote {out} ({len(html) / 1e6:.2f} MB): {shown} of {len(rollouts)} rollouts embedded")
    return 0


# ------------------------------------------------------------------ reading


def load(directory: Path) -> tuple[list[dict[str, Any]], str]:
    """Every rollout of an eval or run directory, normalized; and what was read."""
    for name in ("rollouts.jsonl", "rollouts.jsonl.gz"):
        if (directory / name).is_file():
            return [from_record(r) for r in _read_jsonl(directory / name)], str(directory / name)
    transcripts = sorted((directory / "transcripts").glob("*.txt"))
    if transcripts:
        env = _run_env(directory)
        rollouts = [r for path in transcripts for r in _from_transcript_file(path, env)]
        return rollouts, f"{directory / 'transcripts'} ({len(transcripts)} files)"
    raise InvalidConfigError(
        f"{directory}: neither rollouts.jsonl[.gz] (vt-bench eval --out) nor "
        "transcripts/*.txt (a vt-train run directory)"
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete records (a torn last line is dropped; a later duplicate key wins), read
    one line at a time, without their token ids."""
    opener = gzip.open if path.suffix == ".gz" else open
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                record.pop("token_ids", None)  # not shown; the bulk of a model's records
                key = (record.get("env_id"), record.get("task_id"), record.get("sample"))
                by_key[key if None not in key else (len(by_key),)] = record
    return list(by_key.values())


def from_record(r: Mapping[str, Any]) -> dict[str, Any]:
    calls = list(r.get("tool_calls") or [])
    images = [i for i in r.get("images") or [] if isinstance(i, str) and _DATA_URL.fullmatch(i)]
    meta = {k: r[k] for k in ("policy", "domain", "task", "reward_parts", "verifier_parts",
                              "invalid_actions", "elapsed_s", "reset_seed") if k in r}  # fmt: skip
    return {
        "env": str(r.get("env_id") or "?"),
        "kind": None if r.get("kind") is None else str(r["kind"]),
        "step": None,
        "task_id": str(r.get("task_id", "")),
        "sample": r.get("sample"),
        "reward": _float(r.get("reward")),
        "solved": r.get("correct") if isinstance(r.get("correct"), bool) else None,
        "truncated": bool(r.get("truncated")),
        "truncation": r.get("truncation"),
        "tool_error": any(c.get("ok") is False for c in calls),
        "error": r.get("error"),
        "turns": list(r.get("turns") or []),
        "tool_calls": calls,
        "transcript": str(r.get("transcript") or ""),
        "images": images,
        "meta": meta,
    }


def _run_env(directory: Path) -> str:
    try:
        import yaml

        config = yaml.safe_load((directory / "config.yaml").read_text())
        return str(config["env"]["id"])
    except Exception:
        return "?"


def _from_transcript_file(path: Path, env: str) -> list[dict[str, Any]]:
    """``write_transcripts``' blocks: ``===== task T | reward R | turns N | tool calls C =====``."""
    text = path.read_text(encoding="utf-8")
    heads = list(_HEADER.finditer(text))
    rollouts = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        reward = _float(head["reward"])
        rollouts.append({
            "env": env, "kind": None, "step": path.stem, "task_id": head["task"],
            "sample": None, "reward": reward,
            "solved": None if reward is None else reward >= 1.0,
            "truncated": False, "truncation": None, "tool_error": None, "error": None,
            "turns": [], "tool_calls": [], "transcript": text[head.end() + 1 : end].rstrip("\n"),
            "images": [],
            "meta": {"turns": int(head["turns"]), "tool calls": int(head["calls"])},
        })  # fmt: skip
    return rollouts


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------ the summary


def summary_rows(rollouts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per env id, then one per (env id, kind) under it; from every rollout."""
    groups: dict[tuple[str, str | None], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rollouts:
        groups[(r["env"], None)].append(r)
        if r["kind"] is not None:
            groups[(r["env"], r["kind"])].append(r)
    rows = []
    for (env, kind), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        rewards = [r["reward"] for r in members if r["reward"] is not None]
        solved = [r["solved"] for r in members if r["solved"] is not None]
        counts = [tokens(r) for r in members if r["turns"]]
        rows.append({
            "env": env, "kind": kind, "episodes": len(members),
            "solved": sum(solved) / len(solved) if solved else None,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "truncated": sum(bool(r["truncated"]) for r in members),
            "tool_error": sum(bool(r["tool_error"]) for r in members),
            "errors": sum(r["error"] is not None for r in members),
            "tokens_in": sum(t[0] for t in counts) / len(counts) if counts else None,
            "tokens_out": sum(t[1] for t in counts) / len(counts) if counts else None,
        })  # fmt: skip
    return rows


def _summary_html(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("env", "kind", "episodes", "solved", "mean reward", "truncated", "tool error",
            "errors", "tokens in / ep", "tokens out / ep")  # fmt: skip
    out = ['<table class="sum"><thead><tr>']
    out += [f"<th>{h}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        link = {"env": row["env"], **({"kind": row["kind"]} if row["kind"] is not None else {})}
        cells = [
            row["env"] if row["kind"] is None else "", row["kind"] or "all", row["episodes"],
            _num(row["solved"]), _num(row["mean_reward"]), row["truncated"], row["tool_error"],
            row["errors"], _num(row["tokens_in"], 1), _num(row["tokens_out"], 1),
        ]  # fmt: skip
        href = escape("#" + urlencode(link))
        cells[1] = f'<a href="{href}">{escape(str(cells[1]))}</a>'
        tds = "".join(f"<td>{c if i == 1 else escape(str(c))}</td>" for i, c in enumerate(cells))
        out.append(f'<tr class="{"env" if row["kind"] is None else "kind"}">{tds}</tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


# ------------------------------------------------------------------ the page


def build_page(
    rollouts: Sequence[Mapping[str, Any]],
    *,
    title: str = "VT view",
    source: str = "",
    max_rollouts: int = DEFAULT_MAX_ROLLOUTS,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> str:
    """The HTML document: summary of every rollout, filters, the embedded ones (capped)."""
    picked = _pick(rollouts, max_rollouts)
    note = (
        f"{len(picked)} of {len(rollouts)} rollouts embedded"
        + (f" (--max-rollouts {max_rollouts}, taken in turn from each env)"
           if len(picked) < len(rollouts) else "")
    )  # fmt: skip
    header = f'<h1>{escape(title)}</h1><div class="src">{escape(source)} · {escape(note)}</div>'
    body = "\n".join(render_rollout(r, i, max_chars) for i, r in enumerate(picked))
    return view_page.page(
        title=escape(title), header=header, summary=_summary_html(summary_rows(rollouts)),
        filters=_filters_html(picked), rollouts=body,
    )  # fmt: skip


def _pick(rollouts: Sequence[Mapping[str, Any]], cap: int) -> list[Mapping[str, Any]]:
    """At most ``cap`` rollouts (0: all), round-robin over env ids so each one shows up."""
    if cap <= 0 or len(rollouts) <= cap:
        return list(rollouts)
    by_env: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rollouts:
        by_env[r["env"]].append(r)
    queues, picked = list(by_env.values()), []
    depth = 0
    while len(picked) < cap:
        for queue in queues:
            if depth < len(queue) and len(picked) < cap:
                picked.append(queue[depth])
        depth += 1
    order = {id(r): i for i, r in enumerate(rollouts)}
    return sorted(picked, key=lambda r: order[id(r)])


def _options(name: str, label: str, values: Iterable[tuple[str, str]]) -> str:
    opts = "".join(f'<option value="{escape(v)}">{escape(t)}</option>' for v, t in values)
    return (
        f'<label>{label} <select name="{name}"><option value="">any</option>{opts}</select></label>'
    )


def _filters_html(rollouts: Sequence[Mapping[str, Any]]) -> str:
    envs = sorted({r["env"] for r in rollouts})
    kinds = sorted({r["kind"] for r in rollouts if r["kind"] is not None})
    steps = sorted({r["step"] for r in rollouts if r["step"] is not None})
    yes_no = [("1", "yes"), ("0", "no")]
    parts = ['<form id="filters">', _options("env", "env", ((e, e) for e in envs))]
    if kinds:
        parts.append(_options("kind", "kind", ((k, k) for k in kinds)))
    if steps:
        parts.append(_options("step", "step", ((s, s) for s in steps)))
    parts += [
        _options("solved", "solved", yes_no),
        '<label>reward &ge; <input name="min_reward" type="number" step="any"></label>',
        _options("truncated", "truncated", yes_no),
        _options("tool_error", "tool error", yes_no),
        _options("error", "failed", yes_no),
        '<button type="button" id="reset">clear</button>',
        '<button type="button" id="expand">expand shown</button>',
        '<button type="button" id="collapse">collapse all</button>',
        f'<span><b id="shown">{len(rollouts)}</b> of {len(rollouts)} shown</span></form>',
    ]
    return "".join(parts)
