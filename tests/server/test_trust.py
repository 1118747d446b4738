"""The tool server's trust model, played by outsiders: an unprivileged local user over plain
HTTP (with and without the token), slow and oversized requests, a client whose data differs
from the server's, a loaded event loop. The operator decides what runs; a client only asks.

The hostile client runs as uid 65534 (``nobody``) through ``setpriv``, with the system's
own Python and only its standard library, against ``vt-tool-server`` started by this (root)
test process, as an operator would start it."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import httpx
import numpy as np
import pytest
from test_tool_server import TOKEN, Server, _ports

import vt_envs
from vt_envs.errors import InvalidConfigError, ToolServerRefusedError
from vt_envs.server.app import Busy, ToolServer
from vt_envs.server.config import ServerConfig
from vt_envs.server.protocol import MAX_IMAGE_PIXELS, decode_result, task_ref

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
_as_nobody_possible = (
    os.geteuid() == 0 and shutil.which("setpriv") is not None and os.path.exists(SYSTEM_PYTHON)
)
needs_nobody = pytest.mark.skipif(
    not _as_nobody_possible, reason="needs root (to become uid 65534), setpriv and /usr/bin/python3"
)

# Runs as nobody: reads a list of [method, path, body-or-null, headers] on stdin; prints
# each answer's status and JSON (or text) as one JSON list.
_CLIENT = textwrap.dedent(
    """
    import http.client, json, sys
    port, requests = int(sys.argv[1]), json.loads(sys.stdin.read())
    answers = []
    for method, path, body, headers in requests:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        text = reply.read().decode()
        try:
            answers.append([reply.status, json.loads(text)])
        except ValueError:
            answers.append([reply.status, text])
        conn.close()
    print(json.dumps(answers))
    """
)


def _nobody(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    command = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
               "env", "-i", "PATH=/usr/bin:/bin", *argv]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)


def _ask_as_nobody(port: int, requests: list) -> list:
    done = _nobody([SYSTEM_PYTHON, "-I", "-c", _CLIENT, str(port)], input=json.dumps(requests))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def guarded():
    """One worker serving VT-Math-v0 and VT-Lookup-v0, with small caps."""
    s = Server(1, 60.0, 256, "--env", "VT-Math-v0", "--env", "VT-Lookup-v0",
               "--max-sessions-per-client", "6", "--max-body-bytes", "65536",
               "--read-timeout-s", "2", "--write-timeout-s", "2")  # fmt: skip
    yield s
    s.stop()


@pytest.fixture(scope="module")
def math_task():
    env = vt_envs.make("VT-Math-v0", split="test")
    yield env.tasks[0]
    env.close()


def _open(math_task, episode: str, **fields) -> dict:
    body = {"episode": episode, "env_id": "VT-Math-v0", "env_kwargs": {"split": "test"},
            "tool": "python", "task": task_ref(math_task), "seed": 0}  # fmt: skip
    body.update(fields)
    return body


@needs_nobody
def test_without_the_token_a_local_user_gets_nothing(guarded, math_task):
    hostile = _open(math_task, "x", env_kwargs={"isolation": "none-i-understand-this-is-unsafe"})
    answers = _ask_as_nobody(guarded.port, [
        ["POST", "/v1/sessions", hostile, {"Content-Type": "application/json"}],
        ["POST", "/v1/sessions", hostile, _auth("a-guess")],
        ["GET", "/metrics", None, {}],
        ["GET", "/v1/envs", None, {}],
        ["GET", "/v1/workers", None, {}],
        ["GET", "/health", None, {}],
    ])  # fmt: skip
    assert [status for status, _ in answers[:5]] == [401] * 5
    assert answers[5] == [200, {"status": "ok"}]  # alive, and nothing more
    # Nor can that user read the token off the server: not its argv, not its environment.
    pid = guarded.wait_healthy(0)["pid"]
    with open(f"/proc/{pid}/cmdline") as cmdline:
        assert TOKEN not in cmdline.read()
    peek = _nobody([SYSTEM_PYTHON, "-I", "-c", f"open('/proc/{pid}/environ').read()"])
    assert peek.returncode != 0 and "PermissionError" in peek.stderr


@needs_nobody
def test_a_token_holder_asks_and_the_operator_decides(guarded, math_task, tmp_path):
    secret = tmp_path / "root-only.txt"  # under a 0700 root directory
    secret.write_text("vt-root-secret-5d1e")
    requests = [
        # Sandbox settings, host paths and env ids are the operator's.
        _open(math_task, "a", env_kwargs={"isolation": "none-i-understand-this-is-unsafe"}),
        _open(math_task, "b", task={"id": "swe", "prompt": "x", "assets": {"repo": "/root"}}),
        _open(math_task, "c", env_id="VT-SWE-v0", tool="bash"),
        _open(math_task, "d", env_id="VT-SQL-v0", tool="sql"),
        _open(math_task, "e", env_kwargs={"split": "test", "dataset": str(secret)}),
        _open(math_task, "f", env_kwargs={"split": {"__class__": "x"}}),
        _open(math_task, "g", task={**task_ref(math_task), "prompt_sha256": "0" * 64}),
        _open(math_task, "h", task={"id": "math/test/99999999", "prompt_sha256": "0" * 64}),
        _open(math_task, "ok"),
    ]
    answers = _ask_as_nobody(guarded.port, [["POST", "/v1/sessions", r, _auth()] for r in requests])
    statuses = [status for status, _ in answers]
    assert statuses == [403, 400, 403, 403, 403, 400, 409, 422, 200], answers
    reasons = [answer.get("error", "") for _, answer in answers[:-1]]
    assert "isolation" in reasons[0] and "clients may set ['difficulty'" in reasons[0]
    assert "reference" in reasons[1] and "VT-SWE-v0" in reasons[2] and "dataset" in reasons[4]
    sid = answers[-1][1]["session"]
    code = f"import os; print('uid', os.getuid()); print(open({str(secret)!r}).read())"
    calls = [
        {"arguments": {"code": code}, "timeout_s": 10},
        {"arguments": {"code": "print(1)"}, "timeout_s": "NaN"},  # not JSON's: a string
        {"arguments": {"code": "print(1)"}, "timeout_s": -1},
        {"arguments": {"code": "print(1)"}, "timeout_s": True},
    ]
    path = f"/v1/sessions/{sid}/call"
    bodies = [json.dumps(c) for c in calls]
    bodies.append('{"arguments": {"code": "print(1)"}, "timeout_s": NaN}')  # Python's JSON
    bodies.append('{"arguments": {"code": "print(1)"}, "timeout_s": Infinity}')
    bodies.append('{"arguments": {"code": "print(1)"}, "timeout_s": 1' + "0" * 400 + "}")
    answers = _ask_as_nobody(guarded.port, [["POST", path, b, _auth()] for b in bodies])
    status, ran = answers[0]
    assert status == 200 and "vt-root-secret" not in ran["text"] and "uid 0" not in ran["text"]
    assert [s for s, _ in answers[1:]] == [400] * 6, answers
    assert all("timeout_s" in a["error"] for _, a in answers[1:])
    # Malformed beyond JSON's own errors: a 400 with a reason, never a 500 or a traceback.
    deep = "[" * 60_000  # under the 64 KB cap, far past the JSON parser's recursion limit
    odd = [["POST", "/v1/sessions", deep, _auth()], ["POST", path, deep, _auth()],
           ["POST", "/v1/sessions", _open(math_task, "k", env_kwargs={"key_digits": 30}),
            _auth()]]  # fmt: skip
    assert [s for s, _ in _ask_as_nobody(guarded.port, odd)] == [400, 400, 403]


@needs_nobody
def test_sessions_bodies_and_images_are_capped(guarded, math_task):
    # Sessions per client: 6 here (the previous test holds one); the next is 429, not a hang,
    # whatever address the client claims to forward for.
    opens = [["POST", "/v1/sessions", _open(math_task, f"cap-{i}"),
              {**_auth(), "X-Forwarded-For": f"10.0.0.{i}"}] for i in range(7)]  # fmt: skip
    statuses = [s for s, _ in _ask_as_nobody(guarded.port, opens)]
    assert statuses[-1] == 429 and statuses.count(200) == 5, statuses
    # A body over 64 KB: 413 before the server parses it.
    big = json.dumps({"arguments": {"code": "#" * 100_000}, "timeout_s": 5})
    call = ["POST", "/v1/sessions/x/call", big, _auth()]
    status, answer = _ask_as_nobody(guarded.port, [call])[0]
    assert status == 413 and "too large" in answer["error"]
    # Image bombs in a task are never decoded: tasks travel as references only.
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (8000, 8000)).save(buffer, format="PNG")  # 64 MP, a few KB
    bomb = {"__vt_image_png__": base64.b64encode(buffer.getvalue()).decode()}
    task = {"id": "v", "prompt": "p", "assets": {"images": [bomb] * 4}}
    pid = guarded.wait_healthy(0)["pid"]
    before = _rss_mb(pid)
    status, _ = _ask_as_nobody(guarded.port, [["POST", "/v1/sessions", _open(math_task, "bomb",
                                                task=task), _auth()]])[0]  # fmt: skip
    assert status == 400 and _rss_mb(pid) - before < 50


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):  # the peak: a decode that was freed still shows
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_slow_headers_and_slow_bodies_are_cut_off(guarded):
    """A client that trickles its request holds a connection for read_timeout_s (2 s), not
    forever; other clients are served meanwhile."""
    slow = []
    for _ in range(20):  # headers never finished
        s = socket.create_connection(("127.0.0.1", guarded.port))
        s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    body = socket.create_connection(("127.0.0.1", guarded.port))  # body never finished
    body.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    start = time.monotonic()
    health = httpx.get(f"{guarded.url}/health", timeout=5)
    assert health.status_code == 200
    for s in slow:
        s.settimeout(10)
        assert s.recv(1024) == b""  # closed by the server
        s.close()
    body.settimeout(10)
    answer = body.recv(4096)
    body.close()
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 8


def test_the_operator_fixes_the_tools_and_what_clients_may_choose(tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text(textwrap.dedent("""
        envs:
          VT-Math-v0:
            kwargs: {python_timeout_s: 1.0}
            client_kwargs: [split]
        limits: {max_sessions: 100}
    """))  # fmt: skip
    server = Server(1, 60.0, 256, "--config", str(config))
    try:
        env = gym.make("VT-Math-v0", split="test", python_timeout_s=20.0,
                       tool_server=server.url, tool_server_token=TOKEN)  # fmt: skip
        env.reset(seed=0)
        start = time.monotonic()
        _, _, _, _, info = env.step("<python>while True: pass</python>")
        assert info["tool"]["error"] == "timeout" and time.monotonic() - start < 6  # 1 s, not 20
        env.close()
        # A keyword the operator did not allow, a task the server cannot have, an id it
        # does not serve: the developer's to fix, raised at reset with the server's reason.
        env = gym.make("VT-Math-v0", split="test", difficulty=1, tool_server=server.url,
                       tool_server_token=TOKEN)  # fmt: skip
        with pytest.raises(ToolServerRefusedError, match=r"difficulty.*clients may set"):
            env.reset(seed=0)
        env.close()
        env = gym.make("VT-Math-v0", split="test", tool_server=server.url, tool_server_token=TOKEN)
        with pytest.raises(ToolServerRefusedError, match="inline"):
            env.reset(options={"task": vt_envs.Task("mine", "Compute 1 + 1.", "2")})
        env.close()
        env = gym.make("VT-Lookup-v0", tool_server=server.url, tool_server_token=TOKEN)
        with pytest.raises(ToolServerRefusedError, match="does not serve env id 'VT-Lookup-v0'"):
            env.reset(seed=0)
        env.close()
    finally:
        server.stop()


def test_a_server_needs_a_token_unless_told_by_name():
    env = {k: v for k, v in os.environ.items() if k != "VT_TOOL_SERVER_TOKEN"}
    cli = [sys.executable, "-m", "vt_envs.server.cli", "--port", str(_ports(1))]
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "token is required" in done.stderr
    beyond = [*cli, "--insecure-no-token", "--host", "0.0.0.0"]
    done = subprocess.run(beyond, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "loopback only" in done.stderr
    with pytest.raises(InvalidConfigError, match="needs a token"):
        ToolServer(ServerConfig.build(["VT-Lookup-v0"]))
    with pytest.raises(InvalidConfigError, match="VT-SWE-v0's tools cannot be served"):
        ServerConfig.build(["VT-SWE-v0"])


def test_a_loaded_worker_sheds_calls_at_once_instead_of_timing_them_out(math_task):
    async def scenario():
        server = ToolServer(ServerConfig.build(["VT-Math-v0"]), token=TOKEN)
        await server.start()
        try:
            sid = (await server.open(_open(math_task, "shed")))["session"]
            await asyncio.sleep(0.2)
            time.sleep(1.5)  # the loop is stuck, as under a burst it cannot keep up with
            await asyncio.sleep(0.1)  # the lag probe wakes 1.5 s late
            with pytest.raises(Busy) as shed:
                await server.call(sid, {"arguments": {"code": "print(1)"}, "timeout_s": 10})
            assert shed.value.status == 503 and shed.value.retry_after_s >= 1
            for _ in range(60):  # the loop caught up: calls run again
                await asyncio.sleep(0.1)
                if server.lag_s < server.limits.shed_lag_s:
                    break
            answer = await server.call(sid, {"arguments": {"code": "print(1)"}, "timeout_s": 10})
            assert answer["ok"] and server.metrics.shed == 1
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_reply_images_are_checked_before_decoding():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PNG")
    png = bytearray(buffer.getvalue())
    side = int(MAX_IMAGE_PIXELS**0.5) + 1  # IHDR says: side x side, more than the cap
    png[16:24] = side.to_bytes(4, "big") * 2
    import zlib

    png[29:33] = zlib.crc32(bytes(png[12:29])).to_bytes(4, "big")
    image = {"__vt_image_png__": base64.b64encode(png).decode()}
    reply = {"text": "", "ok": True, "images": [image]}
    with pytest.raises(ValueError, match="pixels"):
        decode_result(reply)
    small = np.zeros((4, 4, 3), np.uint8)
    from vt_envs.tools.remote.protocol import _png

    decoded = decode_result({"text": "", "ok": True, "images": [_png(small)]})
    assert decoded.images[0].shape == (4, 4, 3)


def test_a_client_that_stops_reading_is_dropped(guarded):
    """Pipelined requests whose replies are never read: the server's writes block, and
    write_timeout_s (2 s) later it drops the connection instead of holding it forever.
    (/metrics: its ~2 KB replies fill the socket buffers in seconds; /health's take a
    minute, to the same end.)"""
    import select

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # a tiny receive window
    s.connect(("127.0.0.1", guarded.port))
    s.setblocking(False)
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    chunk = request.encode() * 500
    start, closed = time.monotonic(), None
    while closed is None and time.monotonic() - start < 90:
        _, writable, _ = select.select([], [s], [], 0.2)
        try:
            if writable:
                s.send(chunk)
        except BlockingIOError:
            pass
        except OSError:  # reset by the server
            closed = time.monotonic() - start
    s.close()
    assert closed is not None, "the connection was held for 90 s"
    assert guarded.metrics()["vt_tool_server_write_timeouts_total"] >= 1
    assert httpx.get(f"{guarded.url}/health", timeout=5).status_code == 200


class _FakeServer:
    """A hostile tool server on loopback (stdlib): ``mode`` picks what a call answers."""

    def __init__(self):
        import http.server
        import threading

        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, payload, length=None):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(length or len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._reply({"workers": [f"http://127.0.0.1:{fake.port}"]})

            def do_DELETE(self):
                self._reply({"closed": True})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/sessions":
                    return self._reply({"session": "s", "lease_s": 60})
                self._reply(*fake.answers[fake.mode]())

        self.mode = "ok"
        self.answers = _fake_answers()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def _fake_answers() -> dict:
    from vt_envs.tools.remote.protocol import _png

    def result(**fields):
        return ({"text": "42", "images": [], "ok": True, "error": None, "metrics": {},
                 "ends_episode": None, **fields},)  # fmt: skip

    tiny, big = _png(np.zeros((4, 4, 3), np.uint8)), _png(np.zeros((3000, 3000, 3), np.uint8))
    return {
        "ok": lambda: result(),
        "huge_text": lambda: result(text="7" * (20 << 20)),
        "many_images": lambda: result(images=[tiny] * 17),
        "many_pixels": lambda: result(images=[big] * 8),  # 72 MP in all, 9 MP each
        "declared_huge": lambda: (b"{}", 1 << 30),
        "not_the_protocol": lambda: result(ok="yes", ends_episode=5),
        "not_an_object": lambda: ([1, 2],),
    }


def test_a_hostile_server_cannot_flood_or_crash_the_client():
    """gym.make(id, tool_server=...) against a server that answers too much or garbage:
    each call is a bounded failed (or cut) observation, the episode goes on."""
    import tracemalloc

    fake = _FakeServer()
    env = gym.make("VT-Lookup-v0", tool_server=f"http://127.0.0.1:{fake.port}",
                   tool_server_token=TOKEN, max_observation_tokens=64)  # fmt: skip
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step("<lookup>k</lookup>")
        assert info["tool"]["ok"]
        for mode in ["huge_text", "many_images", "many_pixels", "declared_huge",
                     "not_the_protocol", "not_an_object"]:  # fmt: skip
            fake.mode = mode
            tracemalloc.start()
            start = time.monotonic()
            obs, _, terminated, truncated, info = env.step("<lookup>k</lookup>")
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert time.monotonic() - start < 10, mode
            assert peak < 200 << 20, (mode, peak >> 20)  # a 20 MB text, not gigabytes
            if mode == "huge_text":
                assert info["tool"]["ok"] and len(obs["tokens"]) <= 200
            else:
                assert info["tool"]["error"] == "tool_server_error", (mode, info["tool"])
            if terminated or truncated:
                env.reset(seed=1)
    finally:
        env.close()
        fake.close()


def test_built_configurations_are_evicted_when_unused():
    """Past max_env_configs (2 here) the least recently used configuration without open
    sessions is closed to build a new one; when every one is in use, 429."""
    from vt_envs.server.config import Refused

    def body(episode, num_keys):
        local = vt_envs.make("VT-Lookup-v0", split="test", num_keys=num_keys)
        ref = task_ref(local.tasks[0])
        local.close()
        return {"episode": episode, "env_id": "VT-Lookup-v0", "tool": "lookup",
                "env_kwargs": {"split": "test", "num_keys": num_keys}, "task": ref}  # fmt: skip

    async def scenario():
        config = ServerConfig.build(
            {"VT-Lookup-v0": {"client_kwargs": ["split", "num_keys"]}},
            limits={"max_env_configs": 2},
        )
        server = ToolServer(config, token=TOKEN)
        try:
            await server.open(body("a", 4))
            b = (await server.open(body("b", 5)))["session"]
            await server.close(b)  # the num_keys=5 build is now unused
            await server.open(body("c", 7))  # evicts it
            assert len(server._toolsets) == 2
            assert not any('"num_keys": 5' in key for key in server._toolsets)
            with pytest.raises(Refused) as full:  # both builds in use
                await server.open(body("d", 9))
            assert full.value.status == 429
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_generated_source_is_never_generated_whole_for_a_clients_id():
    from vt_envs.core.task import GeneratedTasks, Task

    made = []

    def generate(split, index):
        made.append(index)
        return Task(f"g/{split}/{index}", f"task {index}")

    source = GeneratedTasks(generate, 10**9, name="g", split="train")
    assert source.find("g/train/123", scan=False).prompt == "task 123"
    assert source.find("not-conventional", scan=False) is None
    assert source.find("g/train/" + "9" * 300, scan=False) is None
    assert made == [123]


def test_tokens_and_fixed_values():
    from vt_envs.server.config import Refused

    with pytest.raises(InvalidConfigError, match="at least 16"):
        ToolServer(ServerConfig.build(["VT-Lookup-v0"]), token="short")
    config = ServerConfig.build({"VT-Math-v0": {"kwargs": {"dataset": "/srv/secret.jsonl"},
                                                "client_kwargs": ["split"]}})  # fmt: skip
    with pytest.raises(Refused) as refused:
        config.served("VT-Math-v0").build_kwargs({"dataset": "/other"})
    assert refused.value.status == 403 and "secret" not in refused.value.reason
