"""``vt-tool-server`` and ``gym.make(id, tool_server=URL)`` on loopback: episodes through
remote tools, deadlines, auth, leases, backpressure, a killed worker, a restarted server
and 500 concurrent sessions. Every failure of the service must be an observation within
the call's deadline, never an exception or a hang."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import gymnasium as gym
import httpx
import pytest

import vt_envs
from vt_envs.errors import InvalidConfigError
from vt_envs.server.app import Busy, ToolServer
from vt_envs.server.client import attach_tool_server
from vt_envs.server.config import ServerConfig
from vt_envs.server.protocol import task_ref

TOKEN = "s3cret-for-tests"


def _ports(n: int) -> int:
    """A first port with ``n`` free ports after it (best effort)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n < 65000 and all(_free(first + i) for i in range(n)):
            return first


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Server:
    """``vt-tool-server`` in a subprocess; ``url``, ``health(i)``, ``metrics(i)``."""

    def __init__(
        self, workers: int = 2, lease_s: float = 60.0, max_inflight: int = 256, *extra: str
    ):
        self.port = _ports(workers)
        self.workers = workers
        self.argv = [sys.executable, "-m", "vt_envs.server.cli", "--port", str(self.port),
                     "--workers", str(workers), "--lease-s", str(lease_s),
                     "--max-inflight", str(max_inflight), *extra]  # fmt: skip
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "VT_TOOL_SERVER_TOKEN": TOKEN}
        self.proc = subprocess.Popen(self.argv, env=env, start_new_session=True)
        for i in range(self.workers):
            self.wait_healthy(i)

    def wait_healthy(self, i: int, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return httpx.get(f"http://127.0.0.1:{self.port + i}/health", timeout=1,
                                 headers={"Authorization": f"Bearer {TOKEN}"}).json()  # fmt: skip
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"worker {i} did not come up")

    def metrics(self, i: int = 0) -> dict[str, float]:
        text = httpx.get(
            f"http://127.0.0.1:{self.port + i}/metrics",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).text
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = Server(workers=2)
    yield s
    s.stop()


def _remote(env_id: str, server: Server, **kwargs):
    return gym.make(env_id, split="test", tool_server=server.url, tool_server_token=TOKEN, **kwargs)


def _python(code: str) -> str:
    return f"<python>{code}</python>"


@pytest.mark.parametrize("env_id", ["VT-Math-v0", "VT-SQL-v0", "VT-Lookup-v0"])
def test_oracle_episodes_through_remote_tools_score_as_local_ones(server, env_id):
    env = _remote(env_id, server)
    before = sum(server.metrics(i).get("vt_tool_server_sessions_opened_total", 0) for i in (0, 1))
    for seed in range(3):
        result = vt_envs.run_episode(env, vt_envs.oracle_for(env_id), seed=seed)
        assert result.reward == 1.0, result.observations
        assert all(i["tool"]["ok"] for i in result.infos if "tool" in i)
    env.close()
    after = sum(server.metrics(i)["vt_tool_server_sessions_opened_total"] for i in (0, 1))
    assert after - before >= 3  # the calls ran there, not here


def test_a_call_past_its_deadline_times_out_there_and_the_session_goes_on(server):
    env = _remote("VT-Math-v0", server, python_timeout_s=1.0)
    env.reset(seed=0)
    start = time.monotonic()
    obs, _, _, _, info = env.step(_python("while True: pass"))
    assert time.monotonic() - start < 1.0 + 2.0 + 5.0  # deadline + grace + margin
    assert info["tool"]["error"] == "timeout" and not info["tool"]["ok"]
    obs, _, _, _, info = env.step(_python("print(6 * 7)"))
    assert info["tool"]["ok"] and "42" in obs["text"]
    env.close()


def test_a_wrong_token_is_an_observation_not_an_exception(server):
    env = gym.make("VT-Math-v0", split="test", tool_server=server.url, tool_server_token="nope")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(_python("print(1)"))
    assert info["tool"]["error"] == "tool_server_auth" and "refused the token" in obs["text"]
    assert not (terminated or truncated)
    env.close()


def test_an_unreachable_server_is_reported_within_seconds():
    port = _ports(1)
    env = gym.make("VT-Math-v0", split="test", tool_server=f"http://127.0.0.1:{port}")
    start = time.monotonic()
    env.reset(seed=0)
    obs, _, _, _, info = env.step(_python("print(1)"))
    assert info["tool"]["error"] == "tool_server_unreachable"
    assert time.monotonic() - start < 20
    env.close()


def test_a_killed_worker_fails_only_its_own_calls_and_comes_back(server):
    envs = [_remote("VT-Math-v0", server, python_timeout_s=20.0) for _ in range(8)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    workers = [env.unwrapped.tools["python"] for env in envs]
    sessions = [env.unwrapped._live.sessions["python"] for env in envs]
    victim_url = sessions[0].worker
    victim = int(victim_url.rsplit(":", 1)[1]) - server.port
    pid = server.wait_healthy(victim)["pid"]
    survivors = [env for env, s in zip(envs, sessions) if s.worker != victim_url]
    assert survivors, "every session landed on one worker"
    assert workers  # the envs' tools are remote

    async def race():
        sleeper = asyncio.ensure_future(
            envs[0].unwrapped.astep(_python("import time; time.sleep(5)"))
        )
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        result = await sleeper
        return result, time.monotonic() - started

    (obs, _, _, _, info), waited = asyncio.run(race())
    assert info["tool"]["error"] in ("tool_server_error", "session_lost") and waited < 10
    for env in survivors:  # the other worker's episodes are untouched
        obs, _, _, _, info = env.step(_python("print(2 + 2)"))
        assert info["tool"]["ok"] and "4" in obs["text"]
    health = server.wait_healthy(victim)  # the supervisor started it again
    assert health["pid"] != pid
    assert server.metrics(victim)["vt_tool_server_worker_restarts_total"] == 1
    obs, _, _, _, info = envs[0].step(_python("print(1)"))  # its state died with it
    assert info["tool"]["error"] == "session_lost" and "restarted" in obs["text"]
    for env in envs:
        env.close()


def test_a_restarted_server_reports_lost_sessions_cleanly():
    server = Server(workers=1)
    try:
        env = _remote("VT-Math-v0", server)
        env.reset(seed=0)
        obs, _, _, _, info = env.step(_python("x = 5"))
        assert info["tool"]["ok"]
        server.stop()
        server.start()
        obs, reward, terminated, truncated, info = env.step(_python("print(x)"))
        assert info["tool"]["error"] == "session_lost" and not (terminated or truncated)
        obs, reward, terminated, truncated, info = env.step("<answer>5</answer>")
        assert terminated  # the episode still ends normally
        env.reset(seed=1)  # and the next one gets a fresh session
        obs, _, _, _, info = env.step(_python("print(3)"))
        assert info["tool"]["ok"] and "3" in obs["text"]
        env.close()
    finally:
        server.stop()


def test_an_abandoned_session_is_reaped_when_its_lease_ends():
    server = Server(workers=1, lease_s=1.0)
    try:
        env = _remote("VT-Math-v0", server)
        env.reset(seed=0)
        env.step(_python("x = 1"))
        assert server.metrics()["vt_tool_server_sessions"] == 1
        time.sleep(2.5)  # the client went quiet (crashed): its lease runs out
        metrics = server.metrics()
        assert metrics["vt_tool_server_sessions"] == 0
        assert metrics["vt_tool_server_sessions_reaped_total"] == 1
        obs, _, _, _, info = env.step(_python("print(x)"))
        assert info["tool"]["error"] == "session_lost"
        env.close()
    finally:
        server.stop()


def test_calls_past_the_inflight_limit_are_refused_at_once():
    async def scenario():
        config = ServerConfig.build(["VT-Math-v0"], limits={"max_inflight": 1})
        server = ToolServer(config, token=TOKEN)
        await server.start()
        env = vt_envs.make("VT-Math-v0", split="test")
        task = env.tasks[0]
        body = {"env_id": "VT-Math-v0", "env_kwargs": {"split": "test"}, "tool": "python",
                "task": task_ref(task)}  # fmt: skip
        a = (await server.open({**body, "episode": "a"}))["session"]
        b = (await server.open({**body, "episode": "b"}))["session"]
        slow = asyncio.ensure_future(
            server.call(a, {"arguments": {"code": "import time; time.sleep(1)"}, "timeout_s": 5})
        )
        await asyncio.sleep(0.3)
        with pytest.raises(Busy):
            await server.call(b, {"arguments": {"code": "print(1)"}, "timeout_s": 5})
        assert (await slow)["ok"] and server.metrics.rejected == 1
        assert (await server.call(b, {"arguments": {"code": "print(1)"}, "timeout_s": 5}))["ok"]
        assert (await server.open({**body, "episode": "a"}))["session"] == a  # idempotent
        await server.stop()
        env.close()

    asyncio.run(scenario())


def test_500_concurrent_sessions_get_their_own_answers(server):
    local = vt_envs.make("VT-Lookup-v0", split="test")
    attach_tool_server(local, server.url, env_id="VT-Lookup-v0", env_kwargs={"split": "test"},
                       token=TOKEN)  # fmt: skip
    tool = local.tools["lookup"]
    tasks = [local.tasks[i] for i in range(len(local.tasks))]

    async def one(i: int):
        task = tasks[i % len(tasks)]
        session = await tool.open_session(task, seed=i)
        key = task.metadata.get("key") or task.prompt.split("key ")[1].rstrip("?")
        result = await tool.call(session, {"key": key}, timeout_s=30)
        await tool.close_session(session)
        return i, key, result

    async def all_of_them():
        try:
            return await asyncio.gather(*(one(i) for i in range(500)))
        finally:
            await tool.aclose()

    results = asyncio.run(all_of_them())
    assert len({i for i, _, _ in results}) == 500
    failed = [(i, r.error, r.text) for i, _, r in results if not r.ok]
    assert not failed, failed[:5]
    for i, key, result in results:
        task = tasks[i % len(tasks)]
        assert result.text.strip() == str(task.gold), (i, key, result.text)
    local.close()


def test_a_thousand_remote_envs_fit_in_memory(server):
    """Each remote env's client keeps 16 HTTP pools; each pool used to make its own
    TLS context (about 0.85 MB and 20 ms), so 64 envs' first resets grew this process
    by about 860 MB. They now share one; the growth is the envs' own state."""
    import psutil

    me = psutil.Process()
    venv = vt_envs.make_vec("VT-Lookup-v0", 64, split="test", tool_server=server.url,
                            tool_server_token=TOKEN)  # fmt: skip
    tasks = [venv.envs[0].unwrapped.tasks[i] for i in range(64)]

    async def reset_all():
        await asyncio.gather(*(venv.areset_at(i, options={"task": t}) for i, t in enumerate(tasks)))

    before = me.memory_info().rss
    try:
        asyncio.run(reset_all())
        grown_mb = (me.memory_info().rss - before) / 2**20
    finally:
        venv.close()
    assert grown_mb < 128, f"64 remote envs' resets grew RSS by {grown_mb:.0f} MB"


def test_a_fresh_server_resolves_many_task_ids_at_once_as_one_at_a_time():
    """A server resolves task ids on two threads; VT-SQL-v0's test questions are the
    k-th distinct draws of a shared bank, so two threads drawing at once used to give
    tasks other prompts than the client's (409 for most of 100 sessions opened together
    on a fresh server). Every session must open."""
    fresh = Server(workers=1)
    local = vt_envs.make("VT-SQL-v0", split="test")
    attach_tool_server(local, fresh.url, env_id="VT-SQL-v0", env_kwargs={"split": "test"},
                       token=TOKEN)  # fmt: skip
    tool = local.tools["sql"]
    tasks = [local.tasks[i] for i in range(len(local.tasks))]

    async def one(task):
        try:
            session = await tool.open_session(task, seed=0)
        except Exception as exc:
            return f"{task.id}: {exc}"
        await tool.close_session(session)
        return None

    async def all_of_them():
        try:
            return await asyncio.gather(*(one(task) for task in tasks))
        finally:
            await tool.aclose()

    try:
        refused = [r for r in asyncio.run(all_of_them()) if r]
    finally:
        local.close()
        fresh.stop()
    assert len(tasks) >= 100
    assert not refused, refused[:3]


def test_an_env_whose_verifier_reads_its_tools_cannot_be_remote(server):
    with pytest.raises(InvalidConfigError, match="working copy"):
        gym.make("VT-SWE-v0", tool_server=server.url)


def test_workers_are_reached_at_the_host_the_client_was_given(server):
    from vt_envs.server.client import ToolServerClient

    client = ToolServerClient(f"http://localhost:{server.port}", token=TOKEN)

    async def ask():
        try:
            return await client.workers()
        finally:
            await client.aclose()

    # The server names itself 127.0.0.1 (as it would 0.0.0.0); the client keeps "localhost".
    assert asyncio.run(ask()) == [f"http://localhost:{server.port + i}" for i in range(2)]


def test_a_call_racing_the_reaper_never_runs_on_a_closing_session():
    async def scenario():
        server = ToolServer(ServerConfig.build(["VT-Math-v0"]), token=TOKEN)
        env = vt_envs.make("VT-Math-v0", split="test")
        body = {"env_id": "VT-Math-v0", "env_kwargs": {"split": "test"}, "tool": "python",
                "task": task_ref(env.tasks[0])}  # fmt: skip
        a = (await server.open({**body, "episode": "a"}))["session"]
        b = (await server.open({**body, "episode": "b"}))["session"]
        tool = server.sessions[a].tool
        real_close = tool.close_session

        async def slow_close(state):  # widen the window between the two closes
            await asyncio.sleep(0.3)
            await real_close(state)

        tool.close_session = slow_close
        for sid in (a, b):
            server.sessions[sid].expires = 0.0
        reaping = asyncio.ensure_future(server.reap())
        await asyncio.sleep(0.1)  # the reaper is closing a; b must already be unknown
        answer = await server.call(b, {"arguments": {"code": "print(1)"}, "timeout_s": 5})
        assert await reaping == 2
        tool.close_session = real_close
        await server.stop()
        env.close()
        return answer

    assert asyncio.run(scenario()) is None  # 404: session lost, not a call on a closed one


def test_a_mixtures_members_run_their_tasks_on_the_server(server):
    """A mixture task's id carries its domain ("VT-Math-v0/math/test/3"); its member runs
    it under the member's own id, the one the server finds in its own task source."""
    from vt_envs.vector.mixture import MixturePolicy

    env = vt_envs.make_mixture({"VT-Math-v0": 1, "VT-Lookup-v0": 1}, split="test",
                               tool_server=server.url, tool_server_token=TOKEN)  # fmt: skip
    domains = set()
    for seed in range(4):
        result = vt_envs.run_episode(env, MixturePolicy(vt_envs.oracle_for), seed=seed)
        assert result.reward == 1.0
        domains.add(result.infos[-1]["env_id"])
    assert domains == {"VT-Math-v0", "VT-Lookup-v0"}
    env.close()
