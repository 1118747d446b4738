"""The HF engine's prefix cache: a multi-turn episode's turn k prefills only what
came after turn k-1, and samples what a full re-prefill would."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.train.test_engines import TOK, tiny_qwen2
from vt_train.engines import HFEngine, SamplingParams
from vt_train.engines.prefix_cache import PrefixCache

OBSERVATIONS = [[11, 12, 13, 14], [21, 22], [31, 32, 33, 34, 35, 36], [41]]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2(seed=1)


async def play(engine: HFEngine, first: list[int], params: SamplingParams, turns: int = 4):
    """One episode: each turn's prompt is the last prompt, what was generated and an
    observation, as the trainer's rollout loop builds it (token ids, never re-encoded)."""
    prompt, generations, prompts = list(first), [], []
    for turn in range(turns):
        prompts.append(prompt)
        generation = await engine.generate(prompt, params)
        generations.append(generation)
        prompt = prompt + generation.token_ids + OBSERVATIONS[turn % len(OBSERVATIONS)]
    return prompts, generations


def same_samples(cached, fresh):
    for (_, ours), (_, theirs) in zip(cached, fresh):
        for a, b in zip(ours, theirs):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.asyncio
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_turns_prefill_only_what_is_new_and_sample_what_a_reprefill_does(model, temperature):
    firsts = [[5, 6, 7, 8, 9], [100] * 12, [3, 1, 4, 1, 5, 9, 2, 6], [42]]
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=7)
    cached = HFEngine(model, TOK, max_batch_size=8)
    fresh = HFEngine(model, TOK, max_batch_size=8, prefix_cache_mb=0)
    # Four episodes at once: hits and misses share batches, rows leave at different times.
    ours = await asyncio.gather(*[play(cached, f, params) for f in firsts])
    theirs = await asyncio.gather(*[play(fresh, f, params) for f in firsts])
    same_samples(ours, theirs)
    expected = 0
    for prompts, generations in ours:
        assert generations[0].metrics["cached_tokens"] == 0  # no episode shares a first token
        expected += len(prompts[0])
        for k in range(1, len(prompts)):
            fed = len(prompts[k - 1]) + len(generations[k - 1].token_ids) - 1  # not the last
            metrics = generations[k].metrics
            assert metrics["cached_tokens"] == fed
            assert metrics["prefill_tokens"] == len(prompts[k]) - fed
            expected += len(prompts[k]) - fed
    assert cached.prefill_tokens == expected
    assert fresh.prefill_tokens == sum(len(p) for prompts, _ in theirs for p in prompts)
    assert cached.prefill_tokens < fresh.prefill_tokens / 2


@pytest.mark.asyncio
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_prompts_admitted_together_prefill_their_shared_prefix_once(model, temperature):
    """A GRPO step's first turns: 3 tasks x 4 samples behind one system prompt, the
    rows' prompts of different lengths (padding between the shared prefix and each
    row's rest), then two more turns each, which reuse those rows' caches."""
    system = [(7 * i) % 50 + 3 for i in range(40)]
    tasks = [[60, 61, 62], [70, 71, 72, 73, 74], [80]]
    firsts = [system + task for task in tasks for _ in range(4)]
    params = SamplingParams(max_new_tokens=4, temperature=temperature, seed=3)
    cached = HFEngine(model, TOK, max_batch_size=16)
    fresh = HFEngine(model, TOK, max_batch_size=16, prefix_cache_mb=0)
    ours = await asyncio.gather(*[play(cached, f, params, turns=3) for f in firsts])
    theirs = await asyncio.gather(*[play(fresh, f, params, turns=3) for f in firsts])
    same_samples(ours, theirs)
    assert all(gens[0].metrics["cached_tokens"] == len(system) for _, gens in ours)
    first_turns = len(system) + sum(len(t) for t in tasks) * 4
    later = sum(g.metrics["prefill_tokens"] for _, gens in ours for g in gens[1:])
    assert cached.prefill_tokens == first_turns + later
    assert fresh.prefill_tokens == sum(len(p) for prompts, _ in theirs for p in prompts)


async def idle(engine: HFEngine) -> None:
    """Wait until the engine's worker has returned, so the next requests sent together
    are admitted together (not split by a worker that is just finishing)."""
    if engine._worker is not None:
        await engine._worker


@pytest.mark.asyncio
async def test_a_group_continuing_one_kept_entry_prefills_only_past_it(model):
    """Greedy samples of one task send the same next prompt at once. What they share
    past their kept entry is prefilled once only when it is long (a long observation),
    and then from the end of the kept entry, not from the first token; the engine's
    count is the rows' counts plus that shared part (red-checked: seeding from the
    first token counted the kept part again)."""
    first = [(5 * i) % 40 + 2 for i in range(20)]
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    cached = HFEngine(model, TOK, max_batch_size=8)
    fresh = HFEngine(model, TOK, max_batch_size=8, prefix_cache_mb=0)
    short, long = [11, 12, 13], [(3 * i) % 30 + 50 for i in range(20)]
    prompt, kept, generated = first, 0, []
    for turn, observation in enumerate([None, short, long]):
        if observation is not None:
            kept = len(prompt) + len(generated) - 1
            prompt = prompt + generated + observation
        await idle(cached)
        before = cached.prefill_tokens
        ours = await asyncio.gather(*[cached.generate(prompt, params) for _ in range(4)])
        theirs = await asyncio.gather(*[fresh.generate(prompt, params) for _ in range(4)])
        for a, b in zip(ours, theirs):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        rows = sum(g.metrics["prefill_tokens"] for g in ours)
        shared = len(prompt) - 1 - kept  # past the kept entry, shared by all four
        seeded = shared if shared >= 16 else 0
        assert [g.metrics["cached_tokens"] for g in ours] == [kept + seeded] * 4, turn
        assert cached.prefill_tokens - before == seeded + rows, turn
        generated = ours[0].token_ids
    assert seeded == len(long)  # the last turn seeded the long observation's part


def kept_length(prompt: list[int], kept: list[list[int]]) -> int:
    """How many leading ids of ``prompt`` the longest-matching kept sequence covers
    (at least one id is left to prefill)."""
    best = 0
    for ids in kept:
        n = 0
        while n < min(len(ids), len(prompt) - 1) and ids[n] == prompt[n]:
            n += 1
        best = max(best, n)
    return best


@pytest.mark.asyncio
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_rows_continuing_different_kept_prefixes_prefill_in_one_forward(model, temperature):
    """One admission: rows continuing four different kept entries of different lengths,
    two rows continuing one entry from the same point, one departing from an entry
    early (same entry, shorter kept part) and two fresh prompts. The hits prefill in
    one forward ([left padding | kept prefix | padding | rest] per row), the fresh rows
    in another, and every row samples what the engine without a cache does."""
    firsts = [[5, 6, 7, 8, 9], [100] * 12, [3, 1, 4, 1, 5, 9, 2, 6], [42]]
    lengths = [3, 7, 5, 2]  # tokens generated at turn 1: kept entries of different lengths

    async def turns(engine):
        params = [
            SamplingParams(max_new_tokens=n, temperature=temperature, seed=n) for n in lengths
        ]
        done = await asyncio.gather(*[engine.generate(f, p) for f, p in zip(firsts, params)])
        kept = [f + d.token_ids[:-1] for f, d in zip(firsts, done)]
        prompts = [f + d.token_ids + obs for f, d, obs in zip(firsts, done, OBSERVATIONS)]
        prompts.append(firsts[1] + done[1].token_ids + [7, 7, 7, 7, 7, 7, 7, 7, 7])
        prompts.append(firsts[2] + done[2].token_ids[:1] + [99, 98])  # departs early
        prompts += [[77, 78, 79], [200] * 7]  # no entry starts with 77 or 200: fresh
        before = len(engine.batch_sizes)
        params = [
            SamplingParams(max_new_tokens=4, temperature=temperature, seed=10 + i)
            for i in range(len(prompts))
        ]
        gens = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(prompts, params)])
        return done, kept, prompts, gens, engine.batch_sizes[before:]

    cached = HFEngine(model, TOK, max_batch_size=16)
    fresh = HFEngine(model, TOK, max_batch_size=16, prefix_cache_mb=0)
    ours, theirs = await turns(cached), await turns(fresh)
    assert ours[2] == theirs[2]  # the same prompts: turn 1 sampled the same
    same_samples([(None, ours[0]), (None, ours[3])], [(None, theirs[0]), (None, theirs[3])])
    done, kept, prompts, gens, admitted = ours
    assert admitted == [6, 2]  # one forward for every hit, one for the fresh prompts
    expected = [kept_length(prompt, kept) for prompt in prompts]
    assert [g.metrics["cached_tokens"] for g in gens] == expected
    assert len(set(expected[:6])) >= 4 and expected[1] == expected[4] and expected[6:] == [0, 0]
    assert expected[5] == len(firsts[2]) + 1
    for prompt, gen, n in zip(prompts, gens, expected):
        assert gen.metrics["prefill_tokens"] == len(prompt) - n


@pytest.mark.asyncio
async def test_a_prompt_that_departs_from_a_kept_one_reuses_the_common_part(model):
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    cached = HFEngine(model, TOK)
    fresh = HFEngine(model, TOK, prefix_cache_mb=0)
    first = [7, 8, 9, 10, 11, 12]
    done = await cached.generate(first, params)
    # The env cut the action after two tokens and appended its own text.
    departed = first + done.token_ids[:2] + [99, 98, 97]
    ours = await cached.generate(departed, params)
    assert ours.metrics["cached_tokens"] == len(first) + 2
    theirs = await fresh.generate(departed, params)
    assert ours.token_ids == theirs.token_ids
    assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


@pytest.mark.asyncio
async def test_new_weights_drop_the_kept_caches(model):
    engine = HFEngine(tiny_qwen2(seed=2), TOK)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    first = [1, 2, 3, 4]
    done = await engine.generate(first, params)
    engine.load_weights(model.state_dict())  # other weights: the old keys/values are wrong
    again = await engine.generate(first + done.token_ids + [5], params)
    assert again.metrics["cached_tokens"] == 0
    reference = await HFEngine(model, TOK, prefix_cache_mb=0).generate(
        first + done.token_ids + [5], params
    )
    assert again.token_ids == reference.token_ids


def test_the_cache_stays_within_its_bytes_and_forgets_the_least_recent():
    def layers(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 2, n, 8), torch.zeros(1, 2, n, 8))]  # 128 bytes a token

    cache = PrefixCache(max_bytes=128 * 25)
    cache.store([1] * 10, layers(10))
    cache.store([2] * 10, layers(10))
    assert cache.lookup([1] * 10 + [0]) is not None  # [1...] is now the most recent
    cache.store([3] * 10, layers(10))  # over budget: [2...] goes
    assert cache.nbytes <= cache.max_bytes and len(cache) == 2
    assert cache.lookup([2] * 11) is None
    cache.store([9] * 30, layers(30))  # larger than the whole budget: not kept
    assert len(cache) == 2 and cache.lookup([9] * 31) is None
    cache.store([1] * 15, layers(15))  # supersedes its own prefix [1] * 10
    length, entry = cache.lookup([1] * 20)
    assert length == 15 and len(entry.ids) == 15 and cache.nbytes <= cache.max_bytes
    assert cache.lookup([1]) is None  # one token: nothing to reuse, it must be prefilled
