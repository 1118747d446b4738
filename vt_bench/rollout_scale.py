"""Rollout scale: the async collector with hundreds to a thousand episodes in flight, real tools.

For each env id and each concurrency ``N`` (default 256, 512 and 1,024) the
benchmark builds ``vt_envs.make_vec(env_id, N)`` (the tools in this process,
or with ``tool_server=URL``: behind ``vt-tool-server`` with ``--workers``
processes), and plays ``N`` episodes at once through
:func:`vt_train.rollout.collect` in async mode:

- the **engine** is the simulated accelerator server of ``rollout-speed``
  (:class:`~vt_bench.rollout_speed.BatchingServerEngine`: continuous batching,
  a decode tick of ``tick_s + per_seq_s * batch``);
- the **policy** is the env's registered oracle, so every call reaches the
  real tool (VT-Math-v0: sandboxed Python, recycled between episodes;
  VT-SQL-v0: sandboxed DuckDB workers; VT-Search-v0: micro-batched dense
  retrieval); before each action it "thinks" a number of filler tokens drawn
  from the request's seed (:class:`OracleScript` reads the trajectory and
  turn from ``params.seed``, see :func:`vt_train.rollout.turn_seed`).

A first wave of ``N`` episodes warms the envs (sandboxes started, workers
spawned, indexes loaded; its wall time is reported as *cold*); the timed wave
plays ``N`` other tasks on the same envs. Reported per level:

- episodes/s of the timed wave;
- the **lower bound** on its wall time and the fraction reached: the largest
  of (a) the critical path, the longest trajectory played again *alone* on a
  warm sub-env (the slowest by its own generation and tool time; ``--replays``
  more); (b) the engine's own floor, ``max(longest, total / max_batch)``
  ticks of ``tick_s`` plus ``per_seq_s`` per generated token; (c) the CPU
  time of this process's busiest thread (the event loop, which runs every
  episode's host work, or a retriever's batcher: a thread runs on one core
  at a time); (d) the CPU
  time of this process and every tool process (sandboxes, the server's
  workers), divided by the CPUs. Which one binds is reported;
- memory: this process's RSS growth and the tool processes' proportional set
  size (PSS) after the warm wave, per episode in flight (the envs idle between
  episodes); the peak RSS of this process during the timed wave;
- tool processes alive (sandboxes, SQL workers) after each wave;
- env step latency p50 / p99 / max (a turn's ``astep``: parsing, the tool
  call, tokenizing the observation) and tool call p50 / p99.

A level whose memory, projected from the previous level's per-episode
figure, would not fit in the memory available is skipped and says so.

Prints Markdown and writes ``rollout_scale.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from vt_bench.rollout_speed import BatchingServerEngine
from vt_train.engines.base import SamplingParams

__all__ = ["ENV_IDS", "OracleScript", "ScaleConfig", "add_arguments", "main", "render",
           "run_benchmark"]  # fmt: skip

ENV_IDS = ("VT-Math-v0", "VT-SQL-v0", "VT-Search-v0")
BACKENDS = ("local", "server")
# A level runs only if its projected memory fits in this fraction of what is available.
_MEMORY_HEADROOM = 0.8


@dataclass(frozen=True)
class ScaleConfig:
    """The work and the simulated hardware (see ``add_arguments``)."""

    env_ids: tuple[str, ...] = ENV_IDS
    concurrency: tuple[int, ...] = (256, 512, 1024)
    backends: tuple[str, ...] = BACKENDS
    server_workers: int = 2
    tick_s: float = 0.01
    per_seq_s: float = 20e-6
    max_batch: int = 1024
    think_tokens: tuple[int, int] = (32, 256)
    replays: int = 1
    seed: int = 0


# --------------------------------------------------------------------- policy


class OracleScript:
    """The env's oracle behind the engine's ``respond(prompt_ids, params)``.

    Every request of trajectory ``i``'s turn ``t`` carries
    ``turn_seed(seed, i, t)``; the script keeps one oracle per trajectory,
    hands it the observation the env appended since its last action (decoded
    from the prompt's new ids) and answers with filler "thinking" of a length
    drawn from the seed, then the oracle's action.
    """

    def __init__(
        self,
        oracle: Callable[[], Any],
        tasks: Sequence[Any],
        tokenizer: Any,
        *,
        seed: int,
        max_turns: int,
        think_tokens: tuple[int, int],
        think_keys: Sequence[tuple[int, int]] | None = None,
    ):
        from vt_train.rollout import turn_seed

        self.oracle, self.tasks, self.tokenizer = oracle, list(tasks), tokenizer
        self.think_tokens = think_tokens
        self._turn_of = {
            turn_seed(seed, i, t): (i, t) for i in range(len(tasks)) for t in range(max_turns)
        }
        # What seeds trajectory i's thinking: (collection seed, index) unless given, so a
        # trajectory replayed alone (index 0 of a collection of one) thinks as it did.
        self._think_keys = (
            list(think_keys) if think_keys else [(seed, i) for i in range(len(tasks))]
        )
        self._playing: dict[int, tuple[Any, int]] = {}  # trajectory -> (oracle, ids read)
        self._filler = tokenizer.encode(" hmm")

    def __call__(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        index, turn = self._turn_of[params.seed]
        if turn == 0:
            policy = self.oracle()
            policy.reset(self.tasks[index])
            read = 0
        else:
            policy, read = self._playing[index]
        observation = self.tokenizer.decode(prompt_ids[read:])
        action = self.tokenizer.encode(policy.act(observation, {}))
        rng = np.random.default_rng([*self._think_keys[index], turn])
        n_think = int(rng.integers(self.think_tokens[0], self.think_tokens[1] + 1))
        think = (self._filler * (n_think // len(self._filler) + 1))[:n_think]
        ids = think + action
        self._playing[index] = (policy, len(prompt_ids) + len(ids))
        return ids


# ------------------------------------------------------------------- process


class _Processes:
    """CPU time and memory of this process and the tool processes (its
    descendants, and the tool server's tree when there is one)."""

    def __init__(self, extra_roots: Sequence[int] = ()):
        import psutil

        self.psutil = psutil
        self.me = psutil.Process()
        self.roots = [psutil.Process(pid) for pid in extra_roots]

    def tool_processes(self) -> list[Any]:
        procs = {p.pid: p for p in self.me.children(recursive=True)}
        for root in self.roots:
            try:
                procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
            except self.psutil.Error:
                pass
        return list(procs.values())

    def cpu_s(self) -> float:
        """CPU seconds of this process and every tool process alive now (with the
        children they reaped)."""
        total = 0.0
        for proc in [self.me, *self.tool_processes()]:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except self.psutil.Error:
                pass
        return total

    def rss_mb(self) -> float:
        return self.me.memory_info().rss / 2**20

    def tools_pss_mb(self) -> tuple[int, float]:
        """(tool processes alive, their summed PSS in MB)."""
        count, pss = 0, 0.0
        for proc in self.tool_processes():
            try:
                pss += proc.memory_full_info().pss / 2**20
                count += 1
            except self.psutil.Error:
                pass
        return count, pss


class _PeakRSS:
    """Samples this process's RSS every ``period_s`` on a thread; ``peak_mb`` after stop."""

    def __init__(self, processes: _Processes, period_s: float = 0.25):
        import threading

        self.processes, self.period_s, self.peak_mb = processes, period_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="vt-peak-rss")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, self.processes.rss_mb())
            self._stop.wait(self.period_s)

    def __enter__(self) -> _PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self.processes.rss_mb())


def available_mb() -> float:
    """Memory available to new work now (``MemAvailable``), in MB."""
    import psutil

    return psutil.virtual_memory().available / 2**20


# ----------------------------------------------------------------- one level


def _tasks(env: Any, start: int, count: int) -> list[Any]:
    source = env.unwrapped.tasks
    return [source[(start + i) % len(source)] for i in range(count)]


def _engine(
    cfg: ScaleConfig, env_id: str, venv: Any, tasks: Sequence[Any], seed: int, think_keys=None
) -> Any:
    import vt_envs

    env = venv.envs[0].unwrapped
    script = OracleScript(
        lambda: vt_envs.oracle_for(env_id),
        tasks,
        env.tokenizer,
        seed=seed,
        max_turns=env.max_turns,
        think_tokens=cfg.think_tokens,
        think_keys=think_keys,
    )
    return BatchingServerEngine(
        script, tick_s=cfg.tick_s, per_seq_s=cfg.per_seq_s, max_batch=cfg.max_batch
    )


async def _wave(
    cfg: ScaleConfig, env_id: str, venv: Any, tasks: Sequence[Any], seed: int, think_keys=None
):
    from vt_train.rollout import collect

    engine = _engine(cfg, env_id, venv, tasks, seed, think_keys)
    try:
        start = time.perf_counter()
        threads = _thread_cpu()
        trajectories = await collect(
            engine, venv, list(tasks), sampling=SamplingParams(max_new_tokens=2048), seed=seed
        )
        after = _thread_cpu()
        wall = time.perf_counter() - start
    finally:
        await engine.aclose()
    busiest = max((t - threads.get(tid, 0.0) for tid, t in after.items()), default=0.0)
    return trajectories, wall, busiest


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process (the event loop's, a retriever's
    batcher, ...): each runs on one core at a time, so the busiest bounds the wall time."""
    import psutil

    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def _alone_estimate(t: Any, tick_alone: float) -> float:
    return t.num_generated * tick_alone + t.metadata["timing"]["tool_latency_s"]


async def _critical_path(cfg: ScaleConfig, env_id: str, venv: Any, trajectories, tasks, seed):
    """The slowest trajectories (by their own generation and tool time) played
    again one at a time on a warm sub-env; the longest wall time."""
    from vt_envs.vector import ToolVectorEnv

    tick_alone = cfg.tick_s + cfg.per_seq_s
    order = sorted(
        range(len(trajectories)), key=lambda i: -_alone_estimate(trajectories[i], tick_alone)
    )
    solo = ToolVectorEnv([venv.envs[0]])
    walls = []
    for i in order[: cfg.replays]:
        # The same task and the same thinking as trajectory i of the wave.
        replay, wall, _ = await _wave(cfg, env_id, solo, [tasks[i]], seed, [(seed, i)])
        if replay[0].num_generated != trajectories[i].num_generated:
            raise RuntimeError(f"the replay of trajectory {i} generated differently")
        walls.append(wall)
    return max(walls)


def _engine_floor(cfg: ScaleConfig, trajectories: Sequence[Any]) -> float:
    tokens = [t.num_generated for t in trajectories]
    ticks = max(max(tokens), -(-sum(tokens) // cfg.max_batch))
    return ticks * cfg.tick_s + sum(tokens) * cfg.per_seq_s


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    a = np.asarray(values) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}  # fmt: skip


async def measure_level(
    cfg: ScaleConfig, env_id: str, n: int, processes: _Processes, env_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Build ``n`` envs, play a warm wave and a timed wave of ``n`` episodes; the figures."""
    import vt_envs

    rss0, (_, pss0) = processes.rss_mb(), processes.tools_pss_mb()
    build = time.perf_counter()
    venv = vt_envs.make_vec(env_id, n, split="test", **env_kwargs)
    try:
        build_s = time.perf_counter() - build
        cold_tasks = _tasks(venv.envs[0], 0, n)
        _, cold_s, _ = await _wave(cfg, env_id, venv, cold_tasks, cfg.seed)
        alive_idle, tools_pss = processes.tools_pss_mb()
        tools_pss -= pss0
        rss_idle = processes.rss_mb()
        tasks = _tasks(venv.envs[0], n, n)
        cpu0 = processes.cpu_s()
        with _PeakRSS(processes) as peak:
            trajectories, wall, thread_cpu = await _wave(cfg, env_id, venv, tasks, cfg.seed + 1)
        cpu = processes.cpu_s() - cpu0
        alive_after = len(processes.tool_processes())
        critical = await _critical_path(cfg, env_id, venv, trajectories, tasks, cfg.seed + 1)
    finally:
        await venv.aclose()
    bounds = {
        "critical_path_s": critical,
        "engine_s": _engine_floor(cfg, trajectories),
        "thread_cpu_s": thread_cpu,
        "cpu_per_core_s": cpu / (os.cpu_count() or 1),
    }
    binding = max(bounds, key=bounds.__getitem__)
    steps = [s for t in trajectories for s in t.metadata["timing"]["step_latencies_s"]]
    calls = [c for t in trajectories for c in t.metadata["timing"]["tool_call_latencies_s"]]
    return {
        "env_id": env_id,
        "concurrency": n,
        "build_s": build_s,
        "cold_wave_s": cold_s,
        "wall_s": wall,
        "episodes_per_s": n / wall,
        "bounds": bounds,
        "binding": binding,
        "fraction_of_bound": bounds[binding] / wall,
        "reward_mean": float(np.mean([t.reward for t in trajectories])),
        "turns_mean": float(np.mean([t.turns for t in trajectories])),
        "generated_tokens": int(sum(t.num_generated for t in trajectories)),
        "tool_calls": len(calls),
        "step": _percentiles(steps),
        "tool_call": _percentiles(calls),
        "memory": {
            "host_rss_growth_mb": rss_idle - rss0,
            "tools_pss_mb": tools_pss,
            "per_idle_episode_mb": (rss_idle - rss0 + tools_pss) / n,
            "host_rss_peak_mb": peak.peak_mb,
        },
        "tool_processes": {"after_warm_wave": alive_idle, "after_timed_wave": alive_after},
    }


# ------------------------------------------------------------------ the runs


async def _run_backend(
    cfg: ScaleConfig, backend: str, processes: _Processes, env_kwargs: Mapping[str, Any]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for env_id in cfg.env_ids:
        per_episode_mb = None
        for n in cfg.concurrency:
            need = per_episode_mb * n if per_episode_mb else None
            free = available_mb()
            if need is not None and need > _MEMORY_HEADROOM * free:
                rows.append({"env_id": env_id, "concurrency": n, "backend": backend,
                             "skipped": f"needs about {need / 1024:.1f} GB "
                                        f"({per_episode_mb:.1f} MB an episode), "
                                        f"{free / 1024:.1f} GB available"})  # fmt: skip
                print(f"  {backend} {env_id} x{n}: skipped ({rows[-1]['skipped']})", flush=True)
                continue
            row = await measure_level(cfg, env_id, n, processes, env_kwargs)
            row["backend"] = backend
            per_episode_mb = max(row["memory"]["per_idle_episode_mb"], 0.01)
            rows.append(row)
            print(f"  {backend} {env_id} x{n}: {row['episodes_per_s']:.1f} episodes/s, "
                  f"{row['fraction_of_bound']:.0%} of the bound ({row['binding']})",
                  flush=True)  # fmt: skip
    return rows


async def run_benchmark(cfg: ScaleConfig) -> dict[str, Any]:
    """Every backend x env id x concurrency of ``cfg``; the JSON-ready report. Each env
    id gets a fresh tool server (what one id's pools keep must not count against the
    next id's memory)."""
    rows: list[dict[str, Any]] = []
    for backend in cfg.backends:
        if backend == "local":
            rows += await _run_backend(cfg, backend, _Processes(), {})
            continue
        from vt_bench.server_speed import start_tool_server

        for env_id in cfg.env_ids:
            server, url, token = start_tool_server(cfg.server_workers, (env_id,), max_inflight=4096)
            try:
                kwargs = {"tool_server": url, "tool_server_token": token}
                one = replace(cfg, env_ids=(env_id,))
                rows += await _run_backend(one, backend, _Processes([server.pid]), kwargs)
            finally:
                server.terminate()
                server.wait(timeout=30)
    return {
        "rows": rows,
        "config": asdict(cfg),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


# ------------------------------------------------------------------- render


def render(report: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    c = report["config"]
    rows = [
        "| env id | tools | in flight | episodes/s | of the bound (binding) | "
        "step p50 / p99 (ms) | tool call p50 / p99 (ms) | memory an idle episode (MB) | "
        "tool processes | cold wave (s) | reward |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"critical_path_s": "critical path", "engine_s": "engine",
             "thread_cpu_s": "one thread's CPU", "cpu_per_core_s": "CPU"}  # fmt: skip
    where = {"local": "in process", "server": f"server, {c['server_workers']} workers"}
    for r in report["rows"]:
        head = f"| {r['env_id']} | {where[r['backend']]} | {r['concurrency']:,} |"
        if "skipped" in r:
            rows.append(f"{head} skipped: {r['skipped']} | | | | | | | |")
            continue
        m, s, t = r["memory"], r["step"], r["tool_call"]
        rows.append(
            f"{head} {r['episodes_per_s']:.1f} | {r['fraction_of_bound']:.0%} "
            f"({names[r['binding']]}) | {s['p50_ms']:.1f} / {s['p99_ms']:.1f} "
            f"| {t['p50_ms']:.1f} / {t['p99_ms']:.1f} | {m['per_idle_episode_mb']:.2f} "
            f"| {r['tool_processes']['after_warm_wave']:,} | {r['cold_wave_s']:.1f} "
            f"| {r['reward_mean']:.2f} |"
        )
    rows += [
        "",
        f"Simulated engine: a decode tick of {c['tick_s'] * 1e3:g} ms + "
        f"{c['per_seq_s'] * 1e6:g} µs per sequence in the batch (at most {c['max_batch']:,}); "
        f"the oracle thinks {c['think_tokens'][0]}-{c['think_tokens'][1]} tokens before each "
        "action. The bound is the largest of: the slowest trajectory replayed alone, the "
        "engine's own floor, the CPU time of this process's busiest thread (the event loop or "
        "a retriever's batcher), and all CPU time (this process and "
        "the tool processes) over the CPUs. Memory an idle episode: this process's RSS growth "
        "plus the tool processes' PSS after the warm wave, over the episodes in flight.",
    ]
    return "\n".join(rows)


# ---------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ScaleConfig()
    parser.add_argument("--envs", nargs="+", default=list(d.env_ids), metavar="ID")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(d.concurrency))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(d.backends))
    parser.add_argument("--server-workers", type=int, default=d.server_workers)
    parser.add_argument("--tick-ms", type=float, default=d.tick_s * 1e3, help="decode step")
    parser.add_argument(
        "--per-seq-us", type=float, default=d.per_seq_s * 1e6, help="extra per batched sequence"
    )
    parser.add_argument("--max-batch", type=int, default=d.max_batch)
    parser.add_argument(
        "--think-tokens", type=int, nargs=2, default=list(d.think_tokens), metavar=("MIN", "MAX")
    )
    parser.add_argument(
        "--replays", type=int, default=d.replays, help="slowest trajectories replayed alone"
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for JSON")


def main(args: argparse.Namespace) -> int:
    cfg = ScaleConfig(
        env_ids=tuple(args.envs),
        concurrency=tuple(args.concurrency),
        backends=tuple(args.backends),
        server_workers=args.server_workers,
        tick_s=args.tick_ms / 1e3,
        per_seq_s=args.per_seq_us / 1e6,
        max_batch=args.max_batch,
        think_tokens=(args.think_tokens[0], args.think_tokens[1]),
        replays=args.replays,
        seed=args.seed,
    )
    report = asyncio.run(run_benchmark(cfg))
    print(render(report))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rollout_scale.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nWrote {path}")
    return 0
