"""The rollout collector on VT-Lookup-v0 with a fake engine (no scripted-engine dependency)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

import vt_envs
from vt_envs.core.tokenizer import load_tokenizer
from vt_envs.domains.lookup import lookup_tasks
from vt_envs.errors import InvalidConfigError
from vt_train.engines.base import Generation, RolloutEngine, SamplingParams
from vt_train.rollout import collect, merge_stop_strings, stream

TOK = load_tokenizer()
KEY_RE = re.compile(r"value of key (\d+)\?")
TOOL_RE = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.S)

Policy = Callable[[str, SamplingParams], str]


def lookup_policy(text: str, params: SamplingParams) -> str:
    """Looks the key up, then answers; the answer is right with probability 1/2
    under the request's seed (a stand-in for sampling). It reads the episode after
    the task's user turn (the worked examples before it hold other keys)."""
    text = text.rsplit("<|im_start|>user\n", 1)[-1]
    tool_outputs = TOOL_RE.findall(text)
    if not tool_outputs:
        return f"<lookup>{KEY_RE.findall(text)[-1]}</lookup>"
    value = tool_outputs[-1].strip()
    if np.random.default_rng(params.seed).random() < 0.5:
        value = value[:-1] + str((int(value[-1]) + 1) % 10)
    return f"<answer>{value}</answer>"


def fake_logprob(token_id: int, position: int) -> float:
    """Distinct per token and position, so misplaced logprobs are caught."""
    return -0.01 * (token_id % 97) - 0.001 * position


class FakeEngine(RolloutEngine):
    """Answers with ``policy(decoded context, params)``; records every request.

    ``delay(context_text)`` seconds of (async) latency per call, and an
    optional ``gate(context_text)`` event awaited before answering.
    """

    def __init__(
        self,
        policy: Policy = lookup_policy,
        *,
        delay: Callable[[str], float] | None = None,
        gate: Callable[[str], asyncio.Event | None] | None = None,
        suffix: Sequence[int] = (),
    ):
        self.policy, self.delay, self.gate, self.suffix = policy, delay, gate, list(suffix)
        self.requests: list[tuple[list[int], SamplingParams]] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        self.requests.append((list(prompt_ids), params))
        text = TOK.decode(list(prompt_ids))
        if self.gate is not None and (event := self.gate(text)) is not None:
            await event.wait()
        if self.delay is not None:
            await asyncio.sleep(self.delay(text))
        ids = (TOK.encode(self.policy(text, params)) + self.suffix)[: params.max_new_tokens]
        reason = "length" if len(ids) == params.max_new_tokens else "stop"
        logprobs = [fake_logprob(t, len(prompt_ids) + k) for k, t in enumerate(ids)]
        return Generation(ids, logprobs, reason)

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        pass

    def score(
        self, sequences: Sequence[Sequence[int]], temperature: float = 1.0
    ) -> list[list[float]]:
        return [[0.0] * max(len(s) - 1, 0) for s in sequences]


def lookup_tasks_list(n: int) -> list[vt_envs.Task]:
    source = lookup_tasks("test")
    return [source[i] for i in range(n)]


def comparable(trajectory: Any) -> dict[str, Any]:
    """Everything but wall-clock timings and which pooled sub-env ran it."""
    d = asdict(trajectory)
    d["metadata"] = {k: v for k, v in d["metadata"].items() if k not in ("timing", "env_index")}
    return d


@pytest.fixture
def venv_factory():
    made = []

    def factory(num_envs: int, **kwargs: Any) -> vt_envs.ToolVectorEnv:
        venv = vt_envs.make_vec("VT-Lookup-v0", num_envs, **kwargs)
        made.append(venv)
        return venv

    yield factory
    for venv in made:
        venv.close()


# ------------------------------------------------------------------ token layout


@pytest.mark.asyncio
async def test_loss_mask_is_one_exactly_on_generated_ids(venv_factory):
    tasks = lookup_tasks_list(3)
    venv = venv_factory(3, render_mode="ansi")
    engine = FakeEngine()
    trajectories = await collect(engine, venv, tasks, seed=1)

    for traj in trajectories:
        assert traj.turns == 2 and traj.terminated and not traj.truncated
        # Rebuild the expected layout from the engine's own requests and outputs.
        mine = [
            (p, q)
            for p, q in engine.requests
            if p[: traj.prompt_length] == traj.input_ids[: traj.prompt_length]
        ]
        ids, mask = traj.input_ids, traj.loss_mask
        generated = [i for i, m in enumerate(mask) if m]
        assert generated, "no generated tokens"
        # Prompt is mask 0; every masked position is a token the engine emitted.
        assert not any(mask[: traj.prompt_length])
        segments = _runs(mask)
        assert len(segments) == traj.turns
        for (start, end), action in zip(segments, traj.actions):
            assert TOK.decode(ids[start:end]) == action
            assert [traj.rollout_logprobs[t] for t in range(start, end)] == [
                fake_logprob(ids[t], t) for t in range(start, end)
            ]
            # The context the engine saw for this turn is exactly ids[:start].
            assert any(p == ids[:start] for p, _ in mine)
        # Off the generated ids, logprobs are 0.0.
        assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, mask) if not m)
        # The boundary the env inserts after the stop string (<|im_end|>\n) is mask 0.
        first_end = segments[0][1]
        assert TOK.decode(ids[first_end : first_end + 2]) == "<|im_end|>\n"
        assert mask[first_end : first_end + 2] == [0, 0]


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of ones."""
    runs, start = [], None
    for t, m in enumerate([*mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


@pytest.mark.asyncio
async def test_input_ids_decode_to_the_env_transcript(venv_factory):
    tasks = lookup_tasks_list(4)
    venv = venv_factory(4, render_mode="ansi")
    trajectories = await collect(FakeEngine(), venv, tasks, seed=3)
    for traj in trajectories:
        env = venv.envs[traj.metadata["env_index"]]
        assert TOK.decode(traj.input_ids) == env.render()
        assert traj.task_id == tasks[traj.group_id].id


@pytest.mark.asyncio
async def test_eos_in_an_action_is_trained_and_the_newline_after_it_is_not(venv_factory):
    """A policy that ends its turn with eos: eos has mask 1, the env's "\\n" after it mask 0."""
    venv = venv_factory(1, render_mode="ansi")
    engine = FakeEngine(suffix=[TOK.eos_token_id])
    (traj,) = await collect(engine, venv, lookup_tasks_list(1), seed=0)
    (_, end), _ = _runs(traj.loss_mask)
    assert traj.input_ids[end - 1] == TOK.eos_token_id and traj.loss_mask[end - 1] == 1
    assert TOK.decode(traj.input_ids[end : end + 1]) == "\n" and traj.loss_mask[end] == 0
    assert TOK.decode(traj.input_ids) == venv.envs[0].render()


# ---------------------------------------------------------- rewards and groups


@pytest.mark.asyncio
async def test_rewards_and_groups(venv_factory):
    tasks = lookup_tasks_list(4)
    n = 4
    venv = venv_factory(16)
    trajectories = await collect(FakeEngine(), venv, tasks, n_samples=n, seed=7)

    assert len(trajectories) == 16
    assert [t.group_id for t in trajectories] == [g for g in range(4) for _ in range(n)]
    assert [t.metadata["sample"] for t in trajectories] == list(range(n)) * 4
    for traj in trajectories:
        task = tasks[traj.group_id]
        assert traj.task_id == task.id
        answered = re.search(r"<answer>(\d+)</answer>", traj.actions[-1]).group(1)
        assert traj.reward == float(answered == task.gold)
        assert traj.reward_parts == {"outcome": traj.reward}
        assert (traj.tool_calls, traj.tool_errors, traj.invalid_actions) == (1, 0, 0)
        assert traj.finish_reasons == ["stop", "stop"]
    rewards = [t.reward for t in trajectories]
    assert set(rewards) == {0.0, 1.0}  # the seeded coin gives both outcomes


@pytest.mark.asyncio
async def test_task_ids_are_run_from_the_env_source(venv_factory):
    venv = venv_factory(2, split="test")
    source = lookup_tasks("test")
    trajectories = await collect(FakeEngine(), venv, ["lookup/test/5", "lookup/test/9"])
    assert [t.task_id for t in trajectories] == ["lookup/test/5", "lookup/test/9"]
    assert [t.group_id for t in trajectories] == [0, 1]
    assert source.get("lookup/test/5").metadata["key"] in trajectories[0].actions[0]


@pytest.mark.asyncio
async def test_invalid_actions_and_truncation_are_counted(venv_factory):
    venv = venv_factory(1, max_turns=3)
    engine = FakeEngine(lambda text, params: "I am not sure.")
    (traj,) = await collect(engine, venv, lookup_tasks_list(1))
    assert traj.truncated and not traj.terminated
    assert traj.metadata["truncation"] == "max_turns"
    assert (traj.turns, traj.invalid_actions, traj.tool_calls, traj.reward) == (3, 3, 0, 0.0)


# ------------------------------------------------------------ schedules, seeds


@pytest.mark.asyncio
@pytest.mark.parametrize("num_envs", [12, 5])
async def test_async_and_sync_modes_give_identical_trajectories(venv_factory, num_envs):
    tasks = lookup_tasks_list(4)
    # Latency varies per task, so the async schedule really interleaves.
    delay = lambda text: 0.002 * (int(KEY_RE.findall(text)[-1]) % 5)  # noqa: E731
    results = {}
    for mode in ("async", "sync"):
        venv = venv_factory(num_envs)
        results[mode] = await collect(
            FakeEngine(delay=delay), venv, tasks, n_samples=3, seed=11, mode=mode
        )
    reference = await collect(FakeEngine(), venv_factory(12), tasks, n_samples=3, seed=11)
    expected = [comparable(t) for t in reference]
    assert [comparable(t) for t in results["async"]] == expected
    assert [comparable(t) for t in results["sync"]] == expected


@pytest.mark.asyncio
async def test_same_seed_same_trajectories_other_seed_other_samples(venv_factory):
    tasks = lookup_tasks_list(3)
    first = await collect(FakeEngine(), venv_factory(6), tasks, n_samples=2, seed=5)
    again = await collect(FakeEngine(), venv_factory(6), tasks, n_samples=2, seed=5)
    other_engine = FakeEngine()
    other = await collect(other_engine, venv_factory(6), tasks, n_samples=2, seed=6)
    assert [comparable(t) for t in first] == [comparable(t) for t in again]
    assert [t.reward for t in first] != [t.reward for t in other]
    # Each (trajectory, turn) gets its own sampling seed.
    seeds = [params.seed for _, params in other_engine.requests]
    assert len(set(seeds)) == len(seeds) == 12


@pytest.mark.asyncio
async def test_fast_trajectories_finish_first(venv_factory):
    tasks = lookup_tasks_list(4)
    rank = {t.metadata["key"]: i for i, t in enumerate(tasks)}
    # Task 0 is the slowest, task 3 the fastest, by a wide margin per call.
    delay = lambda text: 0.06 * (3 - rank[KEY_RE.findall(text)[-1]])  # noqa: E731
    order = [
        t.group_id
        async for t in stream(FakeEngine(delay=delay), venv_factory(4), tasks, mode="async")
    ]
    assert order == [3, 2, 1, 0]


@pytest.mark.asyncio
async def test_a_blocked_trajectory_does_not_block_the_others(venv_factory):
    """Ordering without timing: task 0's generations wait on an event that is
    set only after every other trajectory has finished. Its two samples hold
    two of the three sub-envs; the six others share the third one."""
    tasks = lookup_tasks_list(4)
    release = asyncio.Event()
    slow_key = tasks[0].metadata["key"]
    gate = lambda text: release if KEY_RE.findall(text)[-1] == slow_key else None  # noqa: E731
    finished = []

    async def consume() -> None:
        async for traj in stream(FakeEngine(gate=gate), venv_factory(3), tasks, n_samples=2):
            finished.append(traj.group_id)
            if len(finished) == 6:
                release.set()

    await asyncio.wait_for(consume(), timeout=60)  # a blocking schedule would hang here
    assert sorted(finished[:6]) == [1, 1, 2, 2, 3, 3]
    assert finished[6:] == [0, 0]


# ------------------------------------------------------ sampling and budgets


@pytest.mark.asyncio
async def test_env_stop_strings_are_merged_into_sampling(venv_factory):
    venv = venv_factory(1)
    engine = FakeEngine()
    sampling = SamplingParams(max_new_tokens=40, stop=("STOP", "</answer>"), temperature=0.7)
    await collect(engine, venv, lookup_tasks_list(1), sampling=sampling)
    for _, params in engine.requests:
        assert params.stop == merge_stop_strings(("STOP", "</answer>"), venv.stop_strings)
        assert set(venv.stop_strings) <= set(params.stop) and params.stop[0] == "STOP"
        assert (params.max_new_tokens, params.temperature) == (40, 0.7)


@pytest.mark.asyncio
async def test_max_context_caps_generation_and_ends_the_trajectory(venv_factory):
    venv = venv_factory(1)
    rambling = lambda text, params: "blah " * 200  # noqa: E731
    engine = FakeEngine(rambling)
    (prompt_only,) = await collect(
        FakeEngine(), venv_factory(1), lookup_tasks_list(1), max_context=10
    )
    assert prompt_only.turns == 0 and prompt_only.truncated and not any(prompt_only.loss_mask)

    prompt_len = prompt_only.prompt_length
    max_context = prompt_len + 150
    (traj,) = await collect(engine, venv, lookup_tasks_list(1), max_context=max_context)
    for prompt, params in engine.requests:
        assert len(prompt) + params.max_new_tokens <= max_context
    assert traj.truncated and traj.metadata["truncation"] == "max_context"
    assert len(traj.input_ids) <= max_context
    assert traj.finish_reasons[-1] == "length"
    # The trajectory ends on generated ids: no unread observation at the end.
    assert traj.loss_mask[-1] == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "batch"}, "mode must be one of"),
        ({"n_samples": 0}, "n_samples"),
        ({"max_context": 0}, "max_context"),
    ],
)
@pytest.mark.asyncio
async def test_bad_arguments_raise_typed_errors(venv_factory, kwargs, match):
    with pytest.raises(InvalidConfigError, match=match):
        await collect(FakeEngine(), venv_factory(1), lookup_tasks_list(1), **kwargs)


@pytest.mark.asyncio
async def test_engine_errors_propagate_and_cancel_the_rest(venv_factory):
    class Broken(FakeEngine):
        async def generate(self, prompt_ids, params):
            if len(self.requests) >= 2:
                raise RuntimeError("engine died")
            return await super().generate(prompt_ids, params)

    with pytest.raises(RuntimeError, match="engine died"):
        await collect(Broken(delay=lambda text: 0.001), venv_factory(3), lookup_tasks_list(3))
