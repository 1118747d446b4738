"""The sync facade's loop modes, each in a fresh interpreter (the test process's own
loop may already be threaded): a lone caller drives the loop on its own thread; a
second thread, submit() or a caller with its own running loop moves it to a thread;
Ctrl-C while driving cancels the call and kills its sandbox; a forked child gets a
loop of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = """
import threading, time, gymnasium as gym, vt_envs
from vt_envs.core import loop

def loop_threads():
    return [t for t in threading.enumerate() if t.name == "vt-envs-loop"]

def lookup_episode(env):
    env.reset(seed=0)
    key = env.unwrapped.task.metadata["key"]
    _, _, _, _, info = env.step(f"<lookup>{key}</lookup>")
    _, reward, *_ = env.step(f"<answer>{info['message']['content'].strip()}</answer>")
    return reward
"""


def run(script: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_lone_caller_drives_the_loop_on_its_own_thread():
    out = run(
        """
        env = gym.make("VT-Lookup-v0")
        assert lookup_episode(env) == 1.0
        assert not loop_threads() and loop._thread is None and loop._driver is None
        env.close()
        print("driven")
        """
    )
    assert out.strip() == "driven"


def test_a_second_thread_is_served_while_the_first_drives():
    out = run(
        """
        slow = gym.make("VT-Lookup-v0", tool_delay_s=0.6)
        other = gym.make("VT-Lookup-v0", tool_delay_s=0.6)
        slow.reset(seed=0)
        other.reset(seed=1)
        done = {}

        def second():
            time.sleep(0.1)  # the main thread is driving by now
            key = other.unwrapped.task.metadata["key"]
            other.step(f"<lookup>{key}</lookup>")
            done["at"] = time.monotonic()

        thread = threading.Thread(target=second)
        start = time.monotonic()
        thread.start()
        slow.step(f"<lookup>{slow.unwrapped.task.metadata['key']}</lookup>")
        thread.join(5)
        # Overlapped on the one loop: about 0.7 s, not 1.2 s one after the other.
        assert done["at"] - start < 1.05, done["at"] - start
        assert len(loop_threads()) == 1  # handed to the library's thread
        assert lookup_episode(slow) == 1.0  # and sync calls go on there
        slow.close(); other.close()
        print("threaded")
        """
    )
    assert out.strip() == "threaded"


def test_submit_and_a_running_loop_move_the_loop_to_its_thread():
    out = run(
        """
        import asyncio
        env = gym.make("VT-Lookup-v0")
        assert lookup_episode(env) == 1.0 and not loop_threads()

        async def notebook_cell():  # Jupyter: the caller's thread runs a loop of its own
            return lookup_episode(env)

        assert asyncio.run(notebook_cell()) == 1.0
        assert len(loop_threads()) == 1
        env.close()
        fresh = gym.make("VT-Lookup-v0")

        async def answer():
            await fresh.unwrapped.areset(seed=0)
            return 1

        assert loop.submit(answer()).result(timeout=10) == 1
        fresh.close()
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_ctrl_c_while_driving_cancels_the_call_and_kills_its_sandbox():
    out = run(
        """
        import _thread, os
        env = gym.make("VT-Math-v0", python_timeout_s=30.0)
        env.reset(seed=0)
        env.step("<python>secret = 1</python>")
        session = env.unwrapped._live.sessions["python"]
        pids = session.process.host_pids()
        threading.Timer(0.5, _thread.interrupt_main).start()
        start = time.monotonic()
        try:
            *_, info = env.step("<python>import time\\ntime.sleep(30)</python>")
        except KeyboardInterrupt:
            pass
        else:
            took = time.monotonic() - start
            raise AssertionError(f"no KeyboardInterrupt after {took:.1f} s: {info.get('tool')}")
        assert time.monotonic() - start < 10
        from vt_envs.sandbox.process import _alive
        alive = [p for p in pids if _alive(p)]
        assert not alive, alive
        assert not loop_threads()  # still driven: the interrupt did not need a thread
        _, _, _, _, info = env.step("<python>print('fresh', 'secret' in globals())</python>")
        assert info["message"]["content"].strip().endswith("fresh False"), info["message"]
        env.close()
        print("interrupted")
        """
    )
    assert out.strip() == "interrupted"


def test_a_forked_child_runs_episodes_on_a_loop_of_its_own():
    out = run(
        """
        import os
        env = gym.make("VT-Lookup-v0")
        assert lookup_episode(env) == 1.0
        pid = os.fork()
        if pid == 0:
            if loop._loop is not None:  # the parent's selector and self-pipe are not ours
                os._exit(2)
            child = gym.make("VT-Lookup-v0")
            os._exit(0 if lookup_episode(child) == 1.0 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lookup_episode(env) == 1.0  # the parent's loop is untouched
        env.close()
        print("forked")
        """
    )
    assert out.strip() == "forked"


def test_ctrl_c_at_any_moment_never_leaves_the_loop_claimed():
    """3,000 calls, each hit by a real SIGINT at a random moment (claiming the loop,
    driving it, releasing it): afterwards calls from this and another thread work."""
    out = run(
        """
        import os, random, signal
        async def noop():
            return 1
        rng = random.Random(0)
        swallowed = 0
        for trial in range(3000):
            timer = threading.Timer(rng.uniform(0, 0.003), os.kill, (os.getpid(), signal.SIGINT))
            try:
                timer.start()
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline:
                    loop.run_sync(noop(), method="step", async_method="astep")
                # Python itself drops a KeyboardInterrupt raised inside a weakref callback
                # or __del__ ("Exception ignored in ..."): not the loop's doing, but rare.
                swallowed += 1
            except KeyboardInterrupt:
                pass
            while True:
                try:
                    timer.join()
                    break
                except KeyboardInterrupt:
                    pass
            assert loop._driver is None, f"trial {trial}: still claimed"
        assert swallowed <= 30, f"{swallowed} of 3000 interrupts never reached the caller"
        assert loop.run_sync(noop(), method="step", async_method="astep") == 1
        result = {}
        other = threading.Thread(
            target=lambda: result.update(r=loop.run_sync(noop(), method="s", async_method="a"))
        )
        other.start()
        other.join(5)
        assert result == {"r": 1}, "a call from another thread hung"
        print("never claimed")
        """,
        timeout=300,
    )
    assert out.strip() == "never claimed"


def test_a_child_forked_during_a_driven_call_gets_pythons_own_ctrl_c():
    out = run(
        """
        import os, signal, _signal
        async def fork_now():
            pid = os.fork()
            if pid == 0:
                ours = getattr(_signal.getsignal(signal.SIGINT), "vt_library_handler", False)
                os._exit(3 if ours or signal.set_wakeup_fd(-1) != -1 else 0)
            return pid
        pid = loop.run_sync(fork_now(), method="step", async_method="astep")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child kept the call's handler"
        print("default")
        """
    )
    assert out.strip() == "default"


def test_a_prestarted_pool_refills_between_calls():
    """A refill scheduled during a driven call goes on while the caller waits (the loop
    moves to its thread), so each episode's sandbox is a hand-over, not a cold start."""
    out = run(
        """
        from vt_envs.tools.python import PythonTool
        tool = PythonTool(prestart=1, recycle=False, lazy_start=False)
        call = lambda coro: loop.run_sync(coro, method="x", async_method="y")
        handed = []
        for _ in range(5):
            ready = list(tool._pool._ready)  # what the refill finished while we slept
            session = call(tool.open_session(None))
            handed.append(len(ready) == 1 and session.process is ready[0])
            call(tool.call(session, {"code": "1"}))
            call(tool.close_session(session))
            time.sleep(1.0)  # the policy generates: the refill must progress meanwhile
        call(tool.aclose())
        assert handed[1:] == [True] * 4, handed  # each later episode got a finished refill
        print("handed over")
        """
    )
    assert out.strip() == "handed over"
