"""``vt-bench eval`` through its command line: scripted policies, an OpenAI-compatible
endpoint (a local fake, chat and completions), the report, and resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai import FakeEndpoint, FakeModel

from vt_bench.__main__ import main as vt_bench
from vt_bench.evals.openai_api import restore_stop

PNG = b"\x89PNG\r\n\x1a\n"


def _eval(*argv: str) -> dict:
    assert vt_bench(["eval", *argv, "--no-progress"]) == 0
    out = Path(argv[argv.index("--out") + 1] if "--out" in argv else argv[-1])
    return json.loads((out / "summary.json").read_text())


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]


def _without_timing(summary: dict) -> dict:
    return {
        **summary,
        "envs": {
            e: {k: v for k, v in m.items() if k != "timing"} for e, m in summary["envs"].items()
        },
    }


def test_the_oracle_solves_and_the_baseline_does_not(tmp_path):
    ids = ["VT-Lookup-v0", "VT-Math-v0"]
    oracle = _eval(*ids, "--policy", "oracle", "--tasks", "3", "--samples", "2",
                   "--out", str(tmp_path / "oracle"))  # fmt: skip
    baseline = _eval(*ids, "--policy", "no-tool", "--tasks", "3", "--out", str(tmp_path / "base"))
    for env_id in ids:
        m = oracle["envs"][env_id]
        assert (
            m["episodes"] == 6 and m["accuracy"] == 1.0 and m["pass_at_k"] == {"1": 1.0, "2": 1.0}
        )
        assert m["tool_calls_per_episode"] >= 1 and m["tool_error_rate"] == 0.0
        assert baseline["envs"][env_id]["accuracy"] == 0.0
        assert baseline["envs"][env_id]["tool_calls_per_episode"] == 0.0
    records = _records(tmp_path / "oracle")
    assert {(r["env_id"], r["sample"]) for r in records} == {(e, s) for e in ids for s in (0, 1)}
    call = next(r for r in records if r["env_id"] == "VT-Lookup-v0")["tool_calls"][0]
    assert call["name"] == "lookup" and call["ok"] and call["latency_s"] >= 0
    report = (tmp_path / "oracle" / "REPORT.md").read_text()
    assert "| VT-Math-v0 | 6 | 1.000" in report and "pass@2" in report
    for plot in ("reward_by_env", "pass_at_k", "turns", "tool_usage"):
        assert (tmp_path / "oracle" / f"{plot}.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize("api, token_ids", [("chat", True), ("completions", True),
                                            ("completions", False)])  # fmt: skip
def test_an_openai_compatible_endpoint_is_evaluated(tmp_path, api, token_ids):
    model = FakeModel(wrong_every=3, token_ids=token_ids)
    with FakeEndpoint(model) as url:
        summary = _eval("VT-Lookup-v0", "--policy", f"openai:{url}", "--model", "fake",
                        "--api", api, "--tasks", "6", "--samples", "3", "--max-new-tokens", "16",
                        "--out", str(tmp_path / "run"))  # fmt: skip
    m = summary["envs"]["VT-Lookup-v0"]
    # The fake answers wrong exactly when the answering turn's seed is divisible by 3.
    assert 0.0 < m["accuracy"] < 1.0 and m["pass_at_k"]["3"] >= m["pass_at_k"]["1"]
    assert m["tool_calls_per_episode"] == 1.0 and m["mean_turns"] == 2.0
    records = _records(tmp_path / "run")
    assert len(records) == 18 and all(
        r["turns"][0]["action"].endswith("</lookup>") for r in records
    )
    first = model.bodies[0]
    assert first["model"] == "fake" and "</lookup>" in first["stop"]
    assert ("messages" in first) == (api == "chat")
    if api == "chat":  # what strict servers accept: standard fields and roles only
        assert "include_stop_str_in_output" not in first and "skip_special_tokens" not in first
        roles = {m["role"] for body in model.bodies for m in body["messages"]}
        assert roles <= {"system", "user", "assistant"}
    if api == "completions":
        assert all(isinstance(i, int) for i in first["prompt"])
        assert all(r["token_ids"] for r in records)


def test_an_endpoint_that_fails_for_a_while_is_retried(tmp_path):
    model = FakeModel()
    model.fail_next = 2
    with FakeEndpoint(model) as url:
        summary = _eval("VT-Lookup-v0", "--policy", f"openai:{url}", "--model", "fake",
                        "--api", "chat", "--tasks", "2", "--concurrency", "1",
                        "--out", str(tmp_path / "run"))  # fmt: skip
    assert summary["envs"]["VT-Lookup-v0"]["episodes"] == 2 and model.requests == 6


def test_rollouts_the_endpoint_gives_up_on_fail_the_run_and_resume_plays_them_again(
    tmp_path, capsys
):
    """The run goes on past them, but they are no score: no accuracy for the env, exit 1
    naming how many failed and why; `--resume` plays exactly those again."""
    model = FakeModel()
    model.fail_next = 2 * 4  # every attempt (1 + 3 retries) of the first two rollouts
    out = tmp_path / "run"
    with FakeEndpoint(model) as url:
        argv = ["eval", "VT-Lookup-v0", "--policy", f"openai:{url}", "--model", "fake",
                "--api", "chat", "--tasks", "4", "--concurrency", "1", "--no-progress"]  # fmt: skip
        assert vt_bench([*argv, "--out", str(out)]) == 1
        printed = capsys.readouterr()
        assert "2 of 4 rollouts failed" in printed.err and "EndpointError" in printed.err
        assert f"--resume {out}" in printed.err
        m = json.loads((out / "summary.json").read_text())["envs"]["VT-Lookup-v0"]
        assert m["status"] == "failed" and m["failed"] == 2 and "accuracy" not in m
        assert "HTTP 503" in m["first_error"]
        assert "| VT-Lookup-v0 | not scored: 2 of 4 rollouts failed" in printed.out
        records = _records(out)
        assert len(records) == 4 and sum(r["error"] is not None for r in records) == 2
        before = model.requests
        assert vt_bench(["eval", "--resume", str(out), "--no-progress"]) == 0
    assert model.requests - before == 2 * 2  # the two failed rollouts, 2 requests each
    m = json.loads((out / "summary.json").read_text())["envs"]["VT-Lookup-v0"]
    assert m["status"] == "complete" and m["episodes"] == 4 and m["errors"] == 0
    assert "accuracy" in m and m["truncations"] == {}


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_an_endpoint_that_is_down_exits_non_zero_without_an_accuracy(tmp_path, api, capsys):
    """A closed port: every rollout fails, the command says so and exits 1; nothing reads
    as accuracy 0.000; once the endpoint is up, `--resume` plays every rollout."""
    model = FakeModel(wrong_every=10**9)
    endpoint = FakeEndpoint(model)  # its port is chosen, nothing listens on it yet
    url = f"http://127.0.0.1:{endpoint.port}/v1"
    out = tmp_path / "run"
    code = vt_bench(["eval", "VT-Lookup-v0", "--policy", f"openai:{url}", "--model", "fake",
                     "--api", api, "--tasks", "3", "--out", str(out), "--no-progress"])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 1
    assert "3 of 3 rollouts failed" in printed.err and "ConnectError" in printed.err
    assert "0.000" not in printed.out and "not scored" in printed.out
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["envs"]["VT-Lookup-v0"]) == {"status", "episodes", "failed", "first_error"}
    assert all("EndpointError" in r["error"] for r in _records(out))
    with endpoint:
        assert vt_bench(["eval", "--resume", str(out), "--no-progress"]) == 0
    m = json.loads((out / "summary.json").read_text())["envs"]["VT-Lookup-v0"]
    assert m["episodes"] == 3 and m["accuracy"] == 1.0
    assert [r["error"] for r in _records(out)][-3:] == [None] * 3


def test_env_kwargs_per_env_id_reach_that_env_only_and_survive_resume(tmp_path):
    """`--env-kwargs ID=JSON` applies to that env id (a Math-only keyword does not abort
    the Lookup env), over the plain JSON ones for every env; kept in config.json."""
    out = tmp_path / "run"
    _eval("VT-Lookup-v0", "VT-Math-v0", "--policy", "oracle", "--tasks", "4",
          "--env-kwargs", '{"max_turns": 3}',
          "--env-kwargs", 'VT-Math-v0={"families": ["modpow"]}', "--out", str(out))  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert config["env_kwargs"] == {"max_turns": 3}
    assert config["env_kwargs_by_id"] == {"VT-Math-v0": {"families": ["modpow"]}}
    math = [r for r in _records(out) if r["env_id"] == "VT-Math-v0"]
    assert len(math) == 4 and {r["kind"] for r in math} == {"modpow"}
    # --resume rebuilds the envs from config.json: a replayed Math rollout is modpow too.
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    kept = [line for line in lines if '"VT-Math-v0"' not in line]
    (out / "rollouts.jsonl").write_text("".join(line + "\n" for line in kept))
    resumed = _eval("--resume", str(out))
    assert resumed["envs"]["VT-Math-v0"]["accuracy"] == 1.0
    assert {r["kind"] for r in _records(out) if r["env_id"] == "VT-Math-v0"} == {"modpow"}
    from vt_envs.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="does not play"):
        vt_bench(["eval", "VT-Lookup-v0", "--policy", "oracle", "--out", str(tmp_path / "x"),
                  "--env-kwargs", 'VT-Math-v0={"families": ["modpow"]}'])  # fmt: skip
    with pytest.raises(InvalidConfigError, match="ID=JSON"):
        vt_bench(["eval", "VT-Lookup-v0", "--policy", "oracle", "--out", str(tmp_path / "y"),
                  "--env-kwargs", "max_turns=3"])  # fmt: skip


def test_records_carry_the_task_kind_and_the_report_breaks_results_down_by_it(tmp_path):
    """Each record names its task's family/kind (VT-Math-v0: the generator's family) and
    metadata; summary.json and REPORT.md give reward and accuracy per kind per env."""
    out = tmp_path / "run"
    summary = _eval("VT-Lookup-v0", "VT-Math-v0", "--policy", "oracle", "--tasks", "12",
                    "--out", str(out))  # fmt: skip
    records = _records(out)
    math = [r for r in records if r["env_id"] == "VT-Math-v0"]
    assert (
        all(r["kind"] == r["task"]["family"] for r in math) and len({r["kind"] for r in math}) > 1
    )
    assert all(r["kind"] is None for r in records if r["env_id"] == "VT-Lookup-v0")
    kinds = summary["envs"]["VT-Math-v0"]["kinds"]
    assert set(kinds) == {r["kind"] for r in math}
    for kind, m in kinds.items():
        mine = [r for r in math if r["kind"] == kind]
        assert m["episodes"] == len(mine) and m["accuracy"] == 1.0 and m["tasks"] == len(mine)
    assert summary["envs"]["VT-Lookup-v0"]["kinds"] == {}
    report = (out / "REPORT.md").read_text()
    assert "Per kind, `VT-Math-v0`" in report and "Per kind, `VT-Lookup-v0`" not in report
    first = sorted(kinds)[0]
    assert f"| {first} | {kinds[first]['episodes']} |" in report


def test_a_token_in_env_kwargs_is_refused():
    from vt_bench.evals.runner import EvalConfig
    from vt_envs.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="VT_TOOL_SERVER_TOKEN"):
        EvalConfig(env_ids=["VT-Lookup-v0"], policy="oracle",
                   env_kwargs={"tool_server_token": "x"})  # fmt: skip


def test_resume_after_a_kill_plays_only_what_is_missing_and_ends_the_same(tmp_path):
    model = FakeModel(wrong_every=3, delay_s=0.03)
    args = ["VT-Lookup-v0", "--api", "chat", "--model", "fake", "--tasks", "12",
            "--samples", "2", "--concurrency", "2", "--no-progress"]  # fmt: skip
    with FakeEndpoint(model) as url:
        args += ["--policy", f"openai:{url}"]
        whole = _eval(*args, "--out", str(tmp_path / "whole"))
        killed = tmp_path / "killed"
        command = [sys.executable, "-m", "vt_bench", "eval", *args, "--out", str(killed)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        rollouts = killed / "rollouts.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (
            not rollouts.is_file() or rollouts.read_text().count("\n") < 5
        ):
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kept = len(RecordLines(rollouts))
        assert 5 <= kept < 24, kept
        before = model.requests
        resumed = _eval("--resume", str(killed))
        replayed = model.requests - before
    assert _without_timing(resumed) == _without_timing(whole)
    assert _plays(killed) == _plays(tmp_path / "whole")  # each rollout itself, not only the sums
    assert replayed <= 2 * (24 - kept) + 4  # only the missing rollouts (2 requests each)
    assert len(_records(killed)) == 24


def _plays(out: Path) -> list[dict]:
    """The records in plan order, without their wall-clock fields."""
    records = sorted(_records(out), key=lambda r: r["rollout_index"])
    for r in records:
        r.pop("elapsed_s")
        for call in r["tool_calls"]:
            call.pop("latency_s")
    return records


def RecordLines(path: Path) -> list[str]:
    return [line for line in path.read_text().split("\n")[:-1] if line]


def test_resuming_with_another_config_is_refused(tmp_path):
    _eval("VT-Lookup-v0", "--policy", "oracle", "--tasks", "2", "--out", str(tmp_path))
    from vt_envs.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="another config"):
        vt_bench(["eval", "VT-Lookup-v0", "--policy", "oracle", "--tasks", "3",
                  "--out", str(tmp_path), "--no-progress"])  # fmt: skip


def test_a_stripped_stop_string_is_restored():
    stop = ("</lookup>", "</answer>")
    assert restore_stop("<lookup>017", stop) == "<lookup>017</lookup>"
    assert restore_stop("<answer>4</answer>", stop) == "<answer>4</answer>"
    assert restore_stop("no tag here", stop) == "no tag here"
    assert restore_stop("<answer>1</answer> then <lookup>2", stop) == (
        "<answer>1</answer> then <lookup>2</lookup>"
    )


def test_a_mixture_is_evaluated_as_one_env_with_a_row_per_domain(tmp_path):
    """`vt-bench eval mixture:A=w,B=w`: each episode played by its domain's policy, the
    report's per-domain table (reward, accuracy, turns, tool calls, tool errors)."""
    mixture = "mixture:VT-Lookup-v0=0.5,VT-Math-v0=0.5"
    oracle = _eval(mixture, "--policy", "oracle", "--tasks", "8", "--out", str(tmp_path / "o"))
    domains = oracle["envs"][mixture]["domains"]
    assert set(domains) == {"VT-Lookup-v0", "VT-Math-v0"}
    assert sum(d["episodes"] for d in domains.values()) == 8
    for m in domains.values():
        assert m["accuracy"] == 1.0 and m["tool_calls_per_episode"] >= 1
    assert {r["domain"] for r in _records(tmp_path / "o")} == set(domains)
    report = (tmp_path / "o" / "REPORT.md").read_text()
    assert f"Per domain, `{mixture}`" in report and "| VT-Math-v0 |" in report
    baseline = _eval(mixture, "--policy", "no-tool", "--tasks", "8", "--out", str(tmp_path / "b"))
    assert all(d["accuracy"] == 0.0 for d in baseline["envs"][mixture]["domains"].values())
    with pytest.raises(Exception, match="unknown env id 'VT-Nope-v0'"):
        vt_bench(["eval", "mixture:VT-Nope-v0=1", "--policy", "oracle", "--out", str(tmp_path)])


def _played_as_in_process(out: Path, env_id: str, name: str | None) -> list[dict]:
    """The CLI's records, each checked against ``shortcut_for`` played in-process."""
    import gymnasium as gym

    import vt_envs

    records = _records(out)
    env = gym.make(env_id, split="test")
    try:
        for record in records:
            policy = vt_envs.shortcut_for(env_id, name, env=env)
            expected = vt_envs.run_episode(env, policy, options={"task_id": record["task_id"]})
            assert record["reward"] == expected.reward
            assert record["transcript"].endswith(expected.actions[-1])
    finally:
        env.close()
    return records


def test_the_registered_shortcut_plays_through_the_cli_and_an_id_without_one_is_refused(
    tmp_path,
):
    """``--policy shortcut`` plays the env's registered default shortcut and
    ``shortcut:NAME`` a named one, episode for episode what ``vt_envs.shortcut_for``
    gives; an id without a shortcut, or an unknown name, is refused with the choices."""
    from vt_envs.errors import UnknownNameError

    out = tmp_path / "default"
    summary = _eval("VT-Visual-v0", "--policy", "shortcut", "--tasks", "12", "--out", str(out))
    assert summary["policy"] == "shortcut"
    records = _played_as_in_process(out, "VT-Visual-v0", None)
    assert all(r["tool_calls"] == [] for r in records)
    assert summary["envs"]["VT-Visual-v0"]["accuracy"] < 0.75  # a shortcut, not the oracle

    named = _eval("VT-Math-v0", "--policy", "shortcut:largest", "--tasks", "6",
                  "--out", str(tmp_path / "named"))  # fmt: skip
    assert named["policy"] == "shortcut:largest"
    _played_as_in_process(tmp_path / "named", "VT-Math-v0", "largest")

    with pytest.raises(UnknownNameError, match="VT-Lookup-v0 shortcut"):
        vt_bench(["eval", "VT-Lookup-v0", "--policy", "shortcut", "--out", str(tmp_path / "x")])
    with pytest.raises(UnknownNameError, match="Did you mean 'largest'"):
        vt_bench(["eval", "VT-Math-v0", "--policy", "shortcut:larges",
                  "--out", str(tmp_path / "y")])  # fmt: skip
