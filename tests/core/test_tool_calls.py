"""The tool-call contract, through ``gym.make`` with the real sandboxed tools.

After anything the model's code does to its interpreter or shell — a timeout,
an infinite loop, a memory bomb, a crash, a fork bomb, closed stdout — the
*next* call in the same episode returns its own output; calls in one action
run in order; a cancelled call (close, Ctrl-C) never leaves a sandbox behind
or lets an old reply reach a later call.
"""

from __future__ import annotations

import _thread
import gc
import threading
import time

import gymnasium as gym
import pytest

from vt_envs.sandbox.process import _alive

ENV_ID = "VTTest/Sandbox-v0"  # registered by the sandbox_env_id fixture (tests/conftest.py)
TIMEOUT_S = 1.5


@pytest.fixture(scope="module", autouse=True)
def _registered(sandbox_env_id):
    return sandbox_env_id


def sandbox_pids(env: gym.Env) -> set[int]:
    """Host pids of every live process of the env's current sandboxes."""
    sessions = env.unwrapped._live.sessions.values()
    return {p for s in sessions if s.process is not None for p in s.process.host_pids()}


def tool_text(info: dict) -> str:
    return info["message"]["content"]


PYTHON_BREAKERS = {
    "sleep": "import time\ntime.sleep(100)",
    "infinite_loop": "while True:\n    pass",
    "memory_bomb": "a = []\nwhile True:\n    a.append(bytearray(10**7))",
    "crash": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "closed_stdout": "import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)",
    "exit": "raise SystemExit(3)",
}
BASH_BREAKERS = {
    "sleep": "sleep 100",
    "infinite_loop": "while :; do :; done",
    "memory_bomb": "x=$(head -c 2000000000 /dev/zero | tr '\\0' a)",
    "crash": "kill -9 $$",
    "fork_bomb": ":(){ :|:& };:",
    "closed_stdout": "exec 1>&- 2>&-",
    "exit": "exit 3",
}


@pytest.mark.parametrize("breaker", sorted(PYTHON_BREAKERS))
def test_python_next_call_answers_for_itself(breaker):
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    seen = sandbox_pids(env)
    _, _, _, _, info = env.step(f"<python>{PYTHON_BREAKERS[breaker]}</python>")
    assert info["tool"]["name"] == "python"
    assert info["tool"]["latency_s"] < TIMEOUT_S + 1.0, "the tool, not the backstop, stopped it"
    seen |= sandbox_pids(env)
    for n in range(3):  # and every call after it, each with its own answer
        _, _, _, _, info = env.step(f"<python>print('alive', {n} * 7)</python>")
        assert info["tool"]["ok"], tool_text(info)
        assert tool_text(info) == f"alive {n * 7}"
        seen |= sandbox_pids(env)
    env.close()
    assert not {p for p in seen if _alive(p)}, "a sandbox process survived close()"


@pytest.mark.parametrize("breaker", sorted(BASH_BREAKERS))
def test_bash_next_call_answers_for_itself(breaker):
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    seen = sandbox_pids(env)
    _, _, _, _, info = env.step(f"<bash>{BASH_BREAKERS[breaker]}</bash>")
    assert info["tool"]["name"] == "bash"
    assert info["tool"]["latency_s"] < TIMEOUT_S + 1.0, "the tool, not the backstop, stopped it"
    seen |= sandbox_pids(env)
    for n in range(3):
        _, _, _, _, info = env.step(f"<bash>echo alive $(({n} * 7))</bash>")
        assert tool_text(info) == f"alive {n * 7}\n[exit code 0]", tool_text(info)
        seen |= sandbox_pids(env)
    env.close()
    assert not {p for p in seen if _alive(p)}, "a sandbox process survived close()"


def test_two_calls_in_one_action_run_in_order_on_one_session():
    env = gym.make(ENV_ID, max_calls_per_turn=3)
    obs, _ = env.reset(seed=0)
    assert "up to 3 calls per turn" in obs["text"]
    _, _, _, _, info = env.step(
        "<python>import time\ntime.sleep(0.2)\nx = 41</python>"
        "<python>x += 1</python><python>print(x)</python>"
    )
    assert [t["ok"] for t in info["tools"]] == [True, True, True]
    assert tool_text(info).split("\n")[-1] == "42"
    env.close()


def test_close_during_a_call_kills_the_sandbox_and_never_restarts_it():
    env = gym.make(ENV_ID, timeout_s=30.0)
    env.reset(seed=0)
    python = env.unwrapped._live.sessions["python"]
    pids = sandbox_pids(env)
    result: dict = {}
    stepper = threading.Thread(
        target=lambda: result.update(step=env.step("<python>import time\ntime.sleep(30)</python>"))
    )
    stepper.start()
    time.sleep(0.5)
    env.close()
    stepper.join(timeout=10)
    assert not stepper.is_alive()
    assert python.closed and python.restarts == 0 and python.process is not None
    assert not python.process.alive
    assert not {p for p in pids if _alive(p)}
    info = result["step"][4]
    assert info["tool"]["ok"] is False


def test_ctrl_c_on_a_sync_step_cancels_the_call_and_the_episode_goes_on():
    env = gym.make(ENV_ID, timeout_s=30.0)
    env.reset(seed=0)
    env.step("<python>secret = 1</python>")  # the first call starts the sandbox
    before = env.unwrapped._live.sessions["python"].process.host_pids()
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    try:
        *_, info = env.step("<python>import time\ntime.sleep(30)</python>")
    except KeyboardInterrupt:
        pass
    else:  # say what the step did instead (a fast tool error would explain a missed timer)
        timer.cancel()  # a late interrupt would abort the whole test session
        pytest.fail(
            f"no KeyboardInterrupt; the step returned after "
            f"{time.monotonic() - start:.1f} s: {info.get('tool')}"
        )
    assert time.monotonic() - start < 10
    assert not {p for p in before if _alive(p)}, "the interrupted call's sandbox was not killed"
    _, _, _, _, info = env.step("<python>print('fresh', 'secret' in globals())</python>")
    assert tool_text(info) == "fresh False"  # a new interpreter, not the interrupted one
    env.close()


def test_an_env_dropped_without_close_leaves_no_sandbox():
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    env.step("<bash>echo up</bash>")
    pids = sandbox_pids(env)
    assert pids
    del env
    gc.collect()
    deadline = time.monotonic() + 10
    while {p for p in pids if _alive(p)} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {p for p in pids if _alive(p)}


def test_a_seeded_episode_prints_the_same_hashes_and_random_numbers():
    code = (
        "import random\nprint({'apple', 'banana', 'cherry', 'date', 'fig'}, hash('vt'), "
        "random.random())"
    )

    def run(seed):
        env = gym.make(ENV_ID)
        env.reset(seed=seed)
        _, _, _, _, info = env.step(f"<python>{code}</python>")
        _, _, _, _, bash = env.step("<bash>echo $RANDOM</bash>")
        env.close()
        return tool_text(info), tool_text(bash)

    first, again, other = run(5), run(5), run(6)
    assert first == again
    assert first[0].split()[-1] != other[0].split()[-1]  # random follows the episode seed
