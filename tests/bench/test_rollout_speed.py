"""Smoke test of ``python -m vt_bench rollout-speed`` (tiny sizes, no timing claims),
plus the simulated server's batching semantics (counted in ticks, not seconds)."""

from __future__ import annotations

import asyncio
import json

import pytest

from vt_bench.__main__ import main
from vt_bench.rollout_speed import BatchingServerEngine, JitteredLookupTool
from vt_train.engines.base import SamplingParams

TINY = [
    *("--trajectories", "4", "--n-samples", "2", "--tick-ms", "0.05"),
    *("--think-tokens", "2", "4", "--tool-median-ms", "1", "--tool-max-ms", "5"),
]


def test_rollout_speed_runs_and_writes_json(tmp_path, capsys):
    assert main(["rollout-speed", *TINY, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "rollout_speed.json").read_text())
    assert set(report["modes"]) == {"sync", "async"}
    assert report["identical_trajectories"] is True
    work = report["work"]
    assert work["trajectories"] == 4
    assert 4 <= work["tool_calls"] <= 4 * 3  # one to max_lookups (3) calls each
    assert work["reward_mean"] == 1.0  # the scripted policy answers what the tool returned
    assert report["speedup"] > 0 and report["critical_path_s"] > 0
    out = capsys.readouterr().out
    assert "| sync |" in out and "| async |" in out


@pytest.mark.parametrize("max_batch, expected_ticks", [(8, 4), (1, 2 + 3 + 4)])
@pytest.mark.asyncio
async def test_server_decodes_one_token_per_active_request_per_tick(max_batch, expected_ticks):
    lengths = {1: 2, 2: 3, 3: 5}  # prompt [k] -> k's response length
    engine = BatchingServerEngine(
        lambda prompt, params: [7] * lengths[prompt[0]], tick_s=0.0, max_batch=max_batch
    )
    try:
        params = SamplingParams(max_new_tokens=4)
        generations = await asyncio.gather(*(engine.generate([k], params) for k in lengths))
    finally:
        await engine.aclose()
    assert [len(g.token_ids) for g in generations] == [2, 3, 4]  # max_new_tokens cuts the last
    assert [g.finish_reason for g in generations] == ["stop", "stop", "length"]
    # Batched, the three requests share ticks; one at a time, they queue.
    assert engine.ticks == expected_ticks
    assert engine.sequence_ticks == 2 + 3 + 4


def test_tool_delays_are_reproducible_heavy_tailed_and_capped():
    tool = JitteredLookupTool(median_s=0.1, sigma=1.0, max_s=0.5)
    delays = [tool.delay_for(f"lookup/test/{i}", call) for i in range(200) for call in range(2)]
    assert delays == [tool.delay_for(f"lookup/test/{i}", c) for i in range(200) for c in range(2)]
    median = sorted(delays)[len(delays) // 2]
    assert 0.08 < median < 0.125  # log-normal around median_s
    assert max(delays) == 0.5  # the tail reaches the cap
