"""Rollout speed: the same rollout work, trajectory-level async vs synchronous batch.

The work is VT-Lookup-v0 episodes of several turns, played by a scripted
policy through :func:`vt_train.rollout.collect` in both modes:

- the **engine** is a simulated accelerator server (:class:`BatchingServerEngine`)
  with continuous batching: every tick it decodes one token for each active
  request (up to ``max_batch``), and a tick costs ``tick_s + per_seq_s * k``
  for ``k`` active requests, so a batch of k costs about as much as one, as on
  a GPU. Generation time therefore follows token count;
- the **policy** thinks for a random number of tokens, then looks the key up
  (one to ``max_lookups`` times) and answers, all drawn from the per-request
  seed, so both modes produce the same trajectories;
- the **tool** sleeps a heavy-tailed (log-normal, capped) time per call,
  drawn from ``(task id, call number)``, so both modes meet the same delays.

Reported: wall time of each mode, the speedup of async over sync, and each
mode's efficiency against the critical-path lower bound: the longest single
trajectory's own generation time (its tokens at an unshared tick) plus its
tool time. No schedule can finish before that trajectory does.

Prints a Markdown table and writes ``rollout_speed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import re
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from vt_envs.core.env import ToolEnv
from vt_envs.core.tool import ToolResult
from vt_envs.core.verifier import ExactMatch
from vt_envs.domains.lookup import INSTRUCTIONS, LookupTool, lookup_tasks
from vt_envs.vector import ToolVectorEnv
from vt_train.engines.base import Generation, RolloutEngine, SamplingParams
from vt_train.rollout import collect

__all__ = ["BatchingServerEngine", "JitteredLookupTool", "add_arguments", "main", "run_benchmark"]

MODES = ("sync", "async")


# -------------------------------------------------------------------- engine


@dataclass
class _Request:
    tokens_left: int
    done: asyncio.Future[None]


class BatchingServerEngine(RolloutEngine):
    """A simulated accelerator server behind the :class:`RolloutEngine` protocol.

    ``respond(prompt_ids, params) -> ids`` decides what is generated; the
    server decides *when* it is returned: requests join a continuous batch,
    each tick decodes one token of every active request, and a request
    returns when its last token is decoded.

    Args:
        respond: the scripted policy.
        tick_s: the cost of one decode step for a single sequence.
        per_seq_s: the extra cost per sequence in the batch (batching is
            almost free on an accelerator, not entirely).
        max_batch: requests decoded at once; the rest wait.
    """

    def __init__(
        self,
        respond: Callable[[list[int], SamplingParams], Sequence[int]],
        *,
        tick_s: float,
        per_seq_s: float = 0.0,
        max_batch: int = 256,
    ):
        self.respond, self.tick_s, self.per_seq_s, self.max_batch = (
            respond,
            tick_s,
            per_seq_s,
            max_batch,
        )
        self._waiting: collections.deque[_Request] = collections.deque()
        self._active: list[_Request] = []
        self._wake: asyncio.Event | None = None
        self._server: asyncio.Task[None] | None = None
        self.ticks = 0
        self.sequence_ticks = 0  # sum of batch sizes over ticks

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        ids = [int(t) for t in self.respond(list(prompt_ids), params)][: params.max_new_tokens]
        if ids:
            request = _Request(len(ids), asyncio.get_running_loop().create_future())
            self._waiting.append(request)
            self._ensure_server().set()
            await request.done
        reason = "length" if len(ids) == params.max_new_tokens else "stop"
        return Generation(ids, [-0.5] * len(ids), reason)

    def _ensure_server(self) -> asyncio.Event:
        if self._server is None or self._server.done():
            self._wake = asyncio.Event()
            self._server = asyncio.ensure_future(self._serve())
        assert self._wake is not None
        return self._wake

    async def _serve(self) -> None:
        assert self._wake is not None
        deadline = time.perf_counter()
        while True:
            if not self._waiting and not self._active:
                self._wake.clear()
                await self._wake.wait()
                deadline = time.perf_counter()
            while self._waiting and len(self._active) < self.max_batch:
                self._active.append(self._waiting.popleft())
            k = len(self._active)
            # Deadlines, not fixed sleeps: sleep overshoot and the env's CPU work
            # between ticks do not slow the simulated accelerator down.
            deadline += self.tick_s + self.per_seq_s * k
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            self.ticks += 1
            self.sequence_ticks += k
            for request in self._active:
                request.tokens_left -= 1
                if request.tokens_left == 0:
                    request.done.set_result(None)
            self._active = [r for r in self._active if r.tokens_left > 0]

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        pass

    def score(
        self, sequences: Sequence[Sequence[int]], temperature: float = 1.0
    ) -> list[list[float]]:
        return [[-0.5] * max(len(s) - 1, 0) for s in sequences]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.cancel()
            await asyncio.gather(self._server, return_exceptions=True)


# ---------------------------------------------------------------- env, policy


class _Session(dict):
    """A lookup table that also counts calls (so each call's delay is reproducible)."""

    task_id: str = ""
    calls: int = 0


class JitteredLookupTool(LookupTool):
    """The lookup tool with a heavy-tailed delay per call: log-normal with
    median ``median_s`` and log-std ``sigma``, capped at ``max_s``, drawn from
    ``(task id, call number)``."""

    def __init__(self, *, median_s: float, sigma: float, max_s: float):
        super().__init__(timeout_s=max_s + 5.0)
        self.median_s, self.sigma, self.max_s = median_s, sigma, max_s

    async def open_session(self, task: Any, *, seed: int = 0) -> _Session:
        session = _Session(await super().open_session(task, seed=seed))
        session.task_id = task.id
        return session

    def delay_for(self, task_id: str, call: int) -> float:
        rng = np.random.default_rng([zlib.crc32(task_id.encode()), call])
        return min(self.max_s, self.median_s * float(np.exp(self.sigma * rng.standard_normal())))

    async def call(
        self, session: _Session, arguments: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ToolResult:
        delay = self.delay_for(session.task_id, session.calls)
        session.calls += 1
        await asyncio.sleep(delay)
        result = await super().call(session, arguments, timeout_s=timeout_s)
        return replace(result, metrics={**result.metrics, "delay_s": delay})


def make_policy(
    tokenizer: Any, *, think_tokens: tuple[int, int], max_lookups: int, answer_prob: float = 0.4
) -> Callable[[list[int], SamplingParams], list[int]]:
    """A scripted Lookup policy: ``think`` filler of a random length, then a
    lookup (at least once, at most ``max_lookups`` times) or the answer;
    every choice is drawn from the request's seed."""
    key_re = re.compile(r"value of key (\d+)\?")
    tool_re = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.S)
    filler = tokenizer.encode(" hmm")

    def respond(prompt_ids: list[int], params: SamplingParams) -> list[int]:
        text = tokenizer.decode(prompt_ids)
        rng = np.random.default_rng(params.seed)
        n_think = int(rng.integers(think_tokens[0], think_tokens[1] + 1))
        think = (filler * (n_think // len(filler) + 1))[:n_think]
        outputs = tool_re.findall(text)
        if outputs and (len(outputs) >= max_lookups or rng.random() < answer_prob):
            action = f"<answer>{outputs[-1].strip()}</answer>"
        else:
            action = f"<lookup>{key_re.findall(text)[-1]}</lookup>"
        return think + tokenizer.encode(action)

    return respond


# ----------------------------------------------------------------- benchmark


@dataclass(frozen=True)
class BenchConfig:
    """The rollout work and the simulated hardware (see ``add_arguments``)."""

    trajectories: int = 64
    n_samples: int = 1
    tick_s: float = 0.002
    per_seq_s: float = 20e-6
    max_batch: int = 256
    think_tokens: tuple[int, int] = (8, 96)
    max_lookups: int = 3
    tool_median_s: float = 0.15
    tool_sigma: float = 1.0
    tool_max_s: float = 3.0
    seed: int = 0


def _make_env(cfg: BenchConfig) -> ToolEnv:
    """VT-Lookup-v0's configuration with the jittered tool."""
    tool = JitteredLookupTool(
        median_s=cfg.tool_median_s, sigma=cfg.tool_sigma, max_s=cfg.tool_max_s
    )
    return ToolEnv(
        tools=[tool],
        tasks=lookup_tasks("test"),
        verifier=ExactMatch(),
        instructions=INSTRUCTIONS,
        max_turns=cfg.max_lookups + 1,
        name="VT-Lookup-v0/jittered",
    )


async def _run_mode(cfg: BenchConfig, mode: str) -> dict[str, Any]:
    n_tasks = -(-cfg.trajectories // cfg.n_samples)
    envs = [_make_env(cfg) for _ in range(n_tasks * cfg.n_samples)]
    venv = ToolVectorEnv(envs)
    tasks = [envs[0].tasks[i] for i in range(n_tasks)]
    engine = BatchingServerEngine(
        make_policy(envs[0].tokenizer, think_tokens=cfg.think_tokens, max_lookups=cfg.max_lookups),
        tick_s=cfg.tick_s,
        per_seq_s=cfg.per_seq_s,
        max_batch=cfg.max_batch,
    )
    try:
        start = time.perf_counter()
        trajectories = await collect(
            engine,
            venv,
            tasks,
            n_samples=cfg.n_samples,
            sampling=SamplingParams(max_new_tokens=256),
            seed=cfg.seed,
            mode=mode,
        )
        wall = time.perf_counter() - start
    finally:
        await engine.aclose()
        await venv.aclose()
    return {
        "wall_s": wall,
        "trajectories": trajectories,
        "engine_ticks": engine.ticks,
        "mean_batch": engine.sequence_ticks / max(engine.ticks, 1),
    }


def _critical_path_s(trajectories: Sequence[Any], cfg: BenchConfig) -> float:
    """The longest trajectory alone: its tokens at a batch-of-one tick, plus its tool time."""
    tick_alone = cfg.tick_s + cfg.per_seq_s
    return max(
        t.num_generated * tick_alone + t.metadata["timing"]["tool_latency_s"] for t in trajectories
    )


def _fingerprint(trajectories: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [(t.task_id, tuple(t.input_ids), tuple(t.loss_mask), t.reward) for t in trajectories]


async def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Run the same work in sync then async mode; return the JSON-ready report."""
    results = {mode: await _run_mode(cfg, mode) for mode in MODES}
    trajectories = results["async"]["trajectories"]
    critical = _critical_path_s(trajectories, cfg)
    modes = {
        mode: {
            "wall_s": r["wall_s"],
            "efficiency": critical / r["wall_s"],
            "engine_ticks": r["engine_ticks"],
            "mean_batch": r["mean_batch"],
        }
        for mode, r in results.items()
    }
    turns = [t.turns for t in trajectories]
    tool_s = [t.metadata["timing"]["tool_latency_s"] for t in trajectories]
    return {
        "modes": modes,
        "speedup": results["sync"]["wall_s"] / results["async"]["wall_s"],
        "critical_path_s": critical,
        "identical_trajectories": _fingerprint(trajectories)
        == _fingerprint(results["sync"]["trajectories"]),
        "work": {
            "trajectories": len(trajectories),
            "turns_mean": float(np.mean(turns)),
            "turns_max": int(max(turns)),
            "generated_tokens": int(sum(t.num_generated for t in trajectories)),
            "tool_calls": int(sum(t.tool_calls for t in trajectories)),
            "tool_s_per_trajectory_mean": float(np.mean(tool_s)),
            "reward_mean": float(np.mean([t.reward for t in trajectories])),
        },
        "config": {k: v for k, v in cfg.__dict__.items()},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def render(report: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    rows = [
        "| mode | wall (s) | speedup vs sync | efficiency vs critical path | mean batch |",
        "|---|---:|---:|---:|---:|",
    ]
    sync_wall = report["modes"]["sync"]["wall_s"]
    for mode, m in report["modes"].items():
        rows.append(
            f"| {mode} | {m['wall_s']:.2f} | {sync_wall / m['wall_s']:.2f}x "
            f"| {m['efficiency']:.0%} | {m['mean_batch']:.1f} |"
        )
    w, c = report["work"], report["config"]
    rows += [
        "",
        f"Async is **{report['speedup']:.2f}x** faster than the synchronous batch baseline. "
        f"Critical path (longest single trajectory, alone): {report['critical_path_s']:.2f} s.",
        f"Work: {w['trajectories']} trajectories, {w['turns_mean']:.2f} turns on average "
        f"(max {w['turns_max']}), {w['generated_tokens']} generated tokens, "
        f"{w['tool_calls']} tool calls; tool delay log-normal (median {c['tool_median_s']} s, "
        f"sigma {c['tool_sigma']}, cap {c['tool_max_s']} s); decode tick {c['tick_s'] * 1e3:g} ms "
        f"+ {c['per_seq_s'] * 1e6:g} us per sequence in the batch.",
        f"Both modes produced identical trajectories: {report['identical_trajectories']}.",
    ]
    return "\n".join(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    parser.add_argument("--trajectories", type=int, default=d.trajectories)
    parser.add_argument("--n-samples", type=int, default=d.n_samples, help="samples per task")
    parser.add_argument(
        "--tick-ms", type=float, default=d.tick_s * 1e3, help="decode step, one sequence"
    )
    parser.add_argument(
        "--per-seq-us", type=float, default=d.per_seq_s * 1e6, help="extra per batched sequence"
    )
    parser.add_argument("--max-batch", type=int, default=d.max_batch)
    parser.add_argument(
        "--think-tokens", type=int, nargs=2, default=list(d.think_tokens), metavar=("MIN", "MAX")
    )
    parser.add_argument("--max-lookups", type=int, default=d.max_lookups, help="tool calls, max")
    parser.add_argument("--tool-median-ms", type=float, default=d.tool_median_s * 1e3)
    parser.add_argument("--tool-sigma", type=float, default=d.tool_sigma, help="log-normal sigma")
    parser.add_argument("--tool-max-ms", type=float, default=d.tool_max_s * 1e3)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--out", type=Path, default=Path("bench_out"), help="directory for the JSON"
    )


def main(args: argparse.Namespace) -> int:
    cfg = BenchConfig(
        trajectories=args.trajectories,
        n_samples=args.n_samples,
        tick_s=args.tick_ms / 1e3,
        per_seq_s=args.per_seq_us / 1e6,
        max_batch=args.max_batch,
        think_tokens=(args.think_tokens[0], args.think_tokens[1]),
        max_lookups=args.max_lookups,
        tool_median_s=args.tool_median_ms / 1e3,
        tool_sigma=args.tool_sigma,
        tool_max_s=args.tool_max_ms / 1e3,
        seed=args.seed,
    )
    report = asyncio.run(run_benchmark(cfg))
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rollout_speed.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0
