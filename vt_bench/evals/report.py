"""``REPORT.md`` and its plots, from an evaluation's ``summary.json``.

Plots (PNG, next to the report): ``reward_by_env.png`` (mean reward and
accuracy per env with 95% intervals), ``pass_at_k.png`` (pass@k curves),
``turns.png`` (turns per episode) and ``tool_usage.png`` (calls per episode
by tool). An env id whose rollouts failed (``status: "failed"``) has no
figures: its row says how many failed and the first error, and it is left
out of the plots. Each scored env id whose tasks name a kind gets a
"Per kind" table (reward and accuracy per task family / kind).
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["render_markdown", "write_plots", "write_report"]

PLOTS = ("reward_by_env.png", "pass_at_k.png", "turns.png", "tool_usage.png")


def _interval(m: Mapping[str, Any], key: str) -> str:
    low, high = m[f"{key}_ci95"]
    return f"{m[key]:.3f} [{low:.3f}, {high:.3f}]"


def _scored(envs: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The env ids with metrics (not ``status: "failed"``)."""
    return {e: m for e, m in envs.items() if m.get("status") != "failed"}


def render_markdown(summary: Mapping[str, Any]) -> str:
    config, every = summary["config"], summary["envs"]
    envs = _scored(every)
    ks = sorted({int(k) for m in envs.values() for k in m["pass_at_k"]})
    shown = [k for k in ks if k in (1, 2, 4, 8, 16, 32, 64) or k == ks[-1]] or [1]
    lines = [
        f"# Evaluation: {summary['policy']}",
        "",
        f"{config['tasks']} tasks x {config['samples']} "
        f"sample{'s' if config['samples'] != 1 else ''} per env id on the "
        f"`{config['split']}` split, seed {config['seed']}"
        + (
            ""
            if config["policy"] in ("oracle", "no-tool") or config["policy"].startswith("shortcut")
            else f", temperature {config['temperature']}, top-p {config['top_p']}, "
            f"at most {config['max_new_tokens']} new tokens per turn"
        )
        + ". Intervals are 95%: bootstrap for the mean reward, Wilson for accuracy.",
        "",
        "| env | episodes | mean reward | accuracy | "
        + " | ".join(f"pass@{k}" for k in shown)
        + " | turns | tool calls/ep | invalid | tool errors | tokens in/out |",
        "|---|---:|---|---|" + "---:|" * len(shown) + "---:|---:|---:|---:|---:|",
    ]
    for env_id, m in envs.items():
        passes = " | ".join(
            f"{m['pass_at_k'][str(k)]:.3f}" if str(k) in m["pass_at_k"] else "" for k in shown
        )
        lines.append(
            f"| {env_id} | {m['episodes']} | {_interval(m, 'mean_reward')} | "
            f"{_interval(m, 'accuracy')} | {passes} | {m['mean_turns']:.2f} | "
            f"{m['tool_calls_per_episode']:.2f} | {m['invalid_action_rate']:.1%} | "
            f"{m['tool_error_rate']:.1%} | {m['mean_tokens_in']:.0f} / "
            f"{m['mean_tokens_out']:.0f} |"
        )
    for env_id, m in every.items():
        if env_id not in envs:
            error = " ".join(m["first_error"].split())[:300].replace("|", "\\|")
            lines.append(
                f"| {env_id} | not scored: {m['failed']} of {m['episodes']} rollouts failed "
                f"(first: {error}) |" + " |" * (7 + len(shown))
            )
    for env_id, reason in summary.get("skipped", {}).items():
        lines.append(f"| {env_id} | not played: {reason.split(':')[0]} |" + " |" * (7 + len(shown)))
    lines += [
        "",
        "| env | tool latency p50 / p99 (ms) | s / episode | tools used | tool errors | "
        "truncations | rollout errors |",
        "|---|---:|---:|---|---|---|---:|",
    ]
    for env_id, m in envs.items():
        t = m["timing"]
        lines.append(
            f"| {env_id} | {t['tool_latency_p50_ms']:.1f} / {t['tool_latency_p99_ms']:.1f} | "
            f"{t['mean_episode_s']:.2f} | {_counts(m['tool_usage'])} | "
            f"{_counts(m['tool_errors'])} | {_counts(m['truncations'])} | {m['errors']} |"
        )
    for env_id, m in envs.items():
        if m.get("domains"):
            lines += ["", f"Per domain, `{env_id}`:", "", *_domain_table(m["domains"])]
    for env_id, m in envs.items():
        if m.get("kinds"):
            lines += ["", f"Per kind, `{env_id}`:", "", *_kind_table(m["kinds"])]
    lines += ["", *(f"![{p[:-4]}]({p})" for p in PLOTS), ""]
    lines += [
        f"Machine: Python {platform.python_version()}, {platform.platform()}. Every rollout "
        "(transcript, token ids, reward parts, tool calls) is in `rollouts.jsonl`; the "
        "figures are in `summary.json`.",
        "",
    ]
    return "\n".join(lines)


def _domain_table(domains: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One row per domain of a mixture: reward, accuracy, turns, tool calls and errors."""
    rows = [
        "| domain | episodes | mean reward | accuracy | turns | tool calls/ep | tool errors | "
        "tools used |",
        "|---|---:|---|---|---:|---:|---:|---|",
    ]
    for domain, m in domains.items():
        rows.append(
            f"| {domain} | {m['episodes']} | {_interval(m, 'mean_reward')} | "
            f"{_interval(m, 'accuracy')} | {m['mean_turns']:.2f} | "
            f"{m['tool_calls_per_episode']:.2f} | {m['tool_error_rate']:.1%} | "
            f"{_counts(m['tool_usage'])} |"
        )
    return rows


def _kind_table(kinds: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One row per task kind / family: episodes, tasks, mean reward, accuracy."""
    rows = ["| kind | episodes | tasks | mean reward | accuracy |", "|---|---:|---:|---:|---|"]
    for kind, m in kinds.items():
        rows.append(
            f"| {kind} | {m['episodes']} | {m['tasks']} | {m['mean_reward']:.3f} | "
            f"{_interval(m, 'accuracy')} |"
        )
    return rows


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def write_plots(summary: Mapping[str, Any], out: Path) -> list[Path]:
    """Write the four PNGs into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    envs = _scored(summary["envs"])
    names = list(envs)
    short = [n.removeprefix("VT-").removesuffix("-v0") for n in names]
    x = range(len(names))
    paths = [out / p for p in PLOTS]

    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(names) + 2), 3.8))
    for offset, key, label in ((-0.2, "mean_reward", "mean reward"), (0.2, "accuracy", "accuracy")):
        values = [envs[n][key] for n in names]
        low = [max(0.0, v - envs[n][f"{key}_ci95"][0]) for v, n in zip(values, names)]
        high = [max(0.0, envs[n][f"{key}_ci95"][1] - v) for v, n in zip(values, names)]
        ax.bar([i + offset for i in x], values, 0.38, yerr=[low, high], capsize=3, label=label)
    ax.set_xticks(list(x), short)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("score (95% interval)")
    ax.set_title(f"Reward by env\n{summary['policy']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, paths[0], plt)

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for n, s in zip(names, short):
        curve = sorted((int(k), v) for k, v in envs[n]["pass_at_k"].items())
        if curve:
            ax.plot(*zip(*curve), "o-", label=s)
    ax.set_xlabel("k")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("pass@k (unbiased)")
    ax.set_ylim(0, 1.05)
    ax.set_title("pass@k")
    ax.grid(alpha=0.3)
    if names:
        ax.legend(fontsize=8)
    _save(fig, paths[1], plt)

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    width = 0.8 / max(len(names), 1)
    seen: set[int] = set()
    for j, (n, s) in enumerate(zip(names, short)):
        hist = {int(k): v for k, v in envs[n]["turns_histogram"].items()}
        seen |= set(hist)
        total = max(sum(hist.values()), 1)
        shift = (j - (len(names) - 1) / 2) * width  # the env's bar within each turn's group
        ax.bar([k + shift for k in hist], [v / total for v in hist.values()], width, label=s)
    if seen:
        ax.set_xticks(range(min(seen), max(seen) + 1))
        ax.set_xlim(min(seen) - 0.7, max(seen) + 0.7)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("turns per episode")
    ax.set_ylabel("share of episodes")
    ax.set_title("Turns")
    if names:
        ax.legend(fontsize=8)
    _save(fig, paths[2], plt)

    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(names) + 2), 3.8))
    tools = sorted({t for n in names for t in envs[n]["tool_usage"]})
    bottom = [0.0] * len(names)
    for tool in tools:
        per_ep = [envs[n]["tool_usage"].get(tool, 0) / max(envs[n]["episodes"], 1) for n in names]
        ax.bar(list(x), per_ep, 0.6, bottom=bottom, label=tool)
        bottom = [b + v for b, v in zip(bottom, per_ep)]
    ax.set_xticks(list(x), short)
    ax.set_ylabel("calls per episode")
    ax.set_title("Tool usage")
    if tools:
        ax.legend(fontsize=8)
    _save(fig, paths[3], plt)
    return paths


def _save(fig: Any, path: Path, plt: Any) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(summary: Mapping[str, Any], out: Path) -> Path:
    """``out/REPORT.md`` and the plots; returns the report's path."""
    write_plots(summary, out)
    path = out / "REPORT.md"
    path.write_text(render_markdown(summary))
    return path
