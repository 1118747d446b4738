"""One rollout of ``vt-bench view``'s page, rendered: badges, metadata, turns.

Every string from a record (transcripts, actions, tool errors, task metadata)
is model- or user-written: it goes through :func:`html.escape` here, and
images only as ``data:image/...;base64`` URLs (checked in :mod:`vt_bench.view`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["render_rollout", "split_transcript", "tokens"]

DEFAULT_MAX_CHARS = 20_000

# Where a chat template opens a user turn (ChatML, Llama 3, Gemma, Mistral): the
# prompt from the last one on (the task's question) is shown, the rest folded.
_USER_MARKERS = (
    "<|im_start|>user",
    "<|start_header_id|>user<|end_header_id|>",
    "<start_of_turn>user",
    "[INST]",
)
_SPECIAL = re.compile(r"(<\|[^|<>\s]{1,40}\|>|<image>)")


def tokens(r: Mapping[str, Any]) -> tuple[int, int]:
    """Tokens read and written over the rollout's turns."""
    return (
        sum(int(t.get("tokens_in") or 0) for t in r["turns"]),
        sum(int(t.get("tokens_out") or 0) for t in r["turns"]),
    )


def _flag(value: bool | None) -> str:
    return "" if value is None else ("1" if value else "0")


def render_rollout(r: Mapping[str, Any], index: int, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """One ``<details class="rollout">``: its badges, metadata and turns, all escaped."""
    attrs = {
        "id": f"r{index}", "data-env": r["env"], "data-kind": r["kind"] or "",
        "data-step": r["step"] or "", "data-solved": _flag(r["solved"]),
        "data-reward": "" if r["reward"] is None else repr(r["reward"]),
        "data-truncated": _flag(r["truncated"]), "data-tool-error": _flag(r["tool_error"]),
        "data-error": _flag(r["error"] is not None),
    }  # fmt: skip
    attr_html = " ".join(f'{k}="{escape(v)}"' for k, v in attrs.items())
    badges = [_badge(r)]
    counts = tokens(r) if r["turns"] else None
    line = [r["env"], r["kind"] or "", r["step"] or "", r["task_id"],
            "" if r["sample"] is None else f"sample {r['sample']}",
            f"{len(r['turns'])} turns" if r["turns"] else "",
            f"{counts[0]} tok in / {counts[1]} out" if counts else ""]  # fmt: skip
    if r["truncated"]:
        badges.append(f'<span class="b warn">truncated: {escape(str(r["truncation"]))}</span>')
    if r["tool_error"]:
        badges.append('<span class="b bad">tool error</span>')
    if r["error"] is not None:
        badges.append(f'<span class="b bad">failed: {escape(_clip(str(r["error"]), 200))}</span>')
    summary = "".join(badges) + escape(" · ".join(x for x in line if x))
    return (
        f'<details class="rollout" {attr_html}><summary>{summary}</summary>'
        f'<div class="body">{_meta_html(r)}{_turns_html(r, max_chars)}</div></details>'
    )


def _badge(r: Mapping[str, Any]) -> str:
    reward = "–" if r["reward"] is None else f"{r['reward']:g}"
    css = "dim" if r["solved"] is None else ("ok" if r["solved"] else "bad")
    return f'<span class="b {css}">reward {escape(reward)}</span>'


def _meta_html(r: Mapping[str, Any]) -> str:
    items = "".join(
        f"<dt>{escape(str(k))}</dt><dd>{escape(_clip(_json(v), 2000))}</dd>"
        for k, v in r["meta"].items()
    )
    return f'<dl class="meta">{items}</dl>'


def split_transcript(transcript: str, actions: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(prompt, observation after each action)``, placing the actions from the end (the
    prompt's worked examples come first); ``None`` when an action is not found."""
    ends, limit = [], len(transcript)
    for action in reversed(actions):
        start = transcript.rfind(action, 0, limit) if action else limit
        if start < 0:
            return None
        ends.append((start, start + len(action)))
        limit = start
    ends.reverse()
    observations = [
        transcript[end : (ends[i + 1][0] if i + 1 < len(ends) else len(transcript))]
        for i, (_, end) in enumerate(ends)
    ]
    return transcript[: ends[0][0] if ends else len(transcript)], observations


def _turns_html(r: Mapping[str, Any], max_chars: int) -> str:
    images = _Images(r["images"], r["transcript"].count("<image>"))
    actions = [str(t.get("action") or "") for t in r["turns"]]
    split = split_transcript(r["transcript"], actions) if actions else None
    if split is None:
        text = _text_html(r["transcript"], images, max_chars)
        return f"<details open><summary>transcript</summary><pre>{text}</pre></details>"
    prompt, observations = split
    start = max(prompt.rfind(marker) for marker in _USER_MARKERS)
    start = start if start >= 0 else len(prompt)  # the question: from the last user turn
    out = []
    if start > 0:
        out.append(
            f"<details><summary>prompt ({start} chars)</summary>"
            f"<pre>{_text_html(prompt[:start], images, max_chars)}</pre></details>"
        )
    if start < len(prompt):
        out.append(f'<pre class="q">{_text_html(prompt[start:], images, max_chars)}</pre>')
    calls: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for call in r["tool_calls"]:
        calls[int(call.get("turn", -1))].append(call)
    for i, (turn, obs) in enumerate(zip(r["turns"], observations)):
        finish = turn.get("finish_reason")
        head = f"turn {i} · read {turn.get('tokens_in', '?')} tokens · wrote " + (
            f"{turn.get('tokens_out', '?')}" + (f" · stop: {finish}" if finish else "")
        )
        out.append(f'<div class="turn"><h4>{escape(head)}</h4>')
        out.append(f'<pre class="action">{_text_html(actions[i], None, max_chars)}</pre>')
        for call in calls.get(i, []):
            ok = call.get("ok")
            state = "ok" if ok else f"error: {call.get('error')}"
            latency = call.get("latency_s")
            text = f"tool {call.get('name')} → {state}" + (
                f" ({latency * 1e3:.1f} ms)" if isinstance(latency, (int, float)) else ""
            )
            out.append(f'<div class="call"><span class="b {"ok" if ok else "bad"}">'
                       f"{escape(text)}</span></div>")  # fmt: skip
        if obs:
            out.append(f'<pre class="obs">{_text_html(obs, images, max_chars)}</pre>')
        out.append("</div>")
    return "".join(out)


class _Images:
    """Hands out a record's images to the ``<image>`` placeholders, in order; when there
    are fewer images than placeholders, the last placeholders get them."""

    def __init__(self, images: Sequence[str], placeholders: int):
        self.images, self.skip, self.seen = list(images), max(placeholders - len(images), 0), 0

    def next(self) -> str | None:
        index, self.seen = self.seen - self.skip, self.seen + 1
        return self.images[index] if 0 <= index < len(self.images) else None

    def advance(self, count: int) -> None:
        self.seen += count


def _text_html(text: str, images: _Images | None, max_chars: int) -> str:
    """Escaped text: chat-template tokens dimmed, ``<image>`` replaced by the image (when
    ``images`` is given), the middle of a block over ``max_chars`` cut out."""
    if max_chars > 0 and len(text) > max_chars:
        head, tail = text[: max_chars // 2], text[len(text) - max_chars // 2 :]
        middle = text[len(head) : len(text) - len(tail)]
        cut = f"[… {len(middle)} characters cut (--max-chars {max_chars}) …]"
        first = _text_html(head, images, 0)
        if images is not None:
            images.advance(middle.count("<image>"))
        return first + f'<span class="cut">{escape(cut)}</span>' + _text_html(tail, images, 0)
    out = []
    for part in _SPECIAL.split(text):
        if not part:
            continue
        if part == "<image>" and images is not None:
            url = images.next()
            out.append(
                f'<img src="{escape(url)}" alt="image">'
                if url
                else '<span class="sp">&lt;image&gt;</span>'
            )
        elif _SPECIAL.fullmatch(part):
            out.append(f'<span class="sp">{escape(part)}</span>')
        else:
            out.append(escape(part))
    return "".join(out)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
