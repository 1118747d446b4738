"""Side-by-side timing: one worker process per side, alternating rounds, medians.

A worker is a script speaking JSON lines on stdin/stdout
(:mod:`vt_bench.peers.workers._loop`): ``setup`` once, then ``run n`` per round,
answered with the seconds its own work took, the items done and a check value
(rewards summed, answers judged correct) that both sides must agree on.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["WORKERS", "Worker", "WorkerError", "alternate"]

WORKERS = Path(__file__).resolve().parent / "workers"


class WorkerError(RuntimeError):
    """A worker could not start, import its library, or answer in time."""


class Worker:
    """``python WORKERS/script`` kept running; :meth:`call` sends one request."""

    def __init__(self, python: str | os.PathLike[str], script: str, params: Mapping[str, Any]):
        self.name = script
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))
        }
        # A peer that runs `python` from PATH must get its own venv's.
        env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._proc = subprocess.Popen(
            [str(python), str(WORKERS / script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=self._drain, daemon=True).start()
        self.call({"op": "setup", "params": dict(params)}, timeout_s=600)

    def _drain(self) -> None:
        for line in self._proc.stderr:
            self._stderr.append(line)

    def call(self, message: Mapping[str, Any], *, timeout_s: float = 600) -> dict[str, Any]:
        reply: list[str] = []

        def read() -> None:
            reply.append(self._proc.stdout.readline())

        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise WorkerError(f"{self.name} is gone: {exc}\n{''.join(self._stderr)}") from exc
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not reply or not reply[0]:
            self.close()
            raise WorkerError(
                f"{self.name} did not answer {message.get('op')!r} within {timeout_s:.0f} s; its "
                f"last output:\n{''.join(self._stderr)}"
            )
        answer = json.loads(reply[0])
        if "error" in answer:
            raise WorkerError(f"{self.name}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()


def alternate(vt: Worker, peer: Worker, n: int, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds of ``n`` items on each side, VT first in even rounds; items/s
    per round and side, their medians, and ``ratio`` = VT's median / the peer's; where
    the workers time their parts, ``phases_s_per_item``: each side's median seconds
    per item of each part."""
    rates: dict[str, list[float]] = {"vt": [], "peer": []}
    checks: dict[str, list[Any]] = {"vt": [], "peer": []}
    phases: dict[str, dict[str, list[float]]] = {"vt": {}, "peer": {}}
    for r in range(rounds):
        order = (("vt", vt), ("peer", peer)) if r % 2 == 0 else (("peer", peer), ("vt", vt))
        for side, worker in order:
            answer = worker.call({"op": "run", "n": n})
            rates[side].append(answer["items"] / answer["seconds"])
            checks[side].append(answer["check"])
            for name, seconds in answer.get("phases", {}).items():
                phases[side].setdefault(name, []).append(seconds / answer["items"])
    vt_rate, peer_rate = statistics.median(rates["vt"]), statistics.median(rates["peer"])
    split = {
        side: {name: statistics.median(values) for name, values in named.items()}
        for side, named in phases.items()
        if named
    }
    return {
        **({"phases_s_per_item": split} if split else {}),
        "vt_per_s": vt_rate,
        "peer_per_s": peer_rate,
        "ratio": vt_rate / peer_rate,
        "rounds": rounds,
        "items_per_round": n,
        "rates": rates,
        "checks": checks,
    }
