"""The SWE editor and working copies: SWE-agent's commands, typed refusals, no escape."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
import time

import gymnasium as gym
import pytest

import vt_envs  # noqa: F401  (registers the ids)
from vt_envs.domains.swe.editor import EditorTool
from vt_envs.domains.swe.files import PathError, SafeRoot
from vt_envs.domains.swe.workspace import Workspace

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture
def base(tmp_path):
    root = tmp_path / "base"
    (root / "pkg" / "deep" / "deeper").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(SOURCE)
    (root / "pkg" / "deep" / "deeper" / "far.py").write_text("x = 1\n")
    (root / ".hidden").write_text("no\n")
    (root / "README.md").write_text("# calc\n" + "line\n" * 5000)
    return root


@pytest.fixture
def workspace(base):
    ws = Workspace(base)
    yield ws
    ws.close()


def _editor(workspace):
    tool = EditorTool(lambda task: workspace.files)
    return tool, asyncio.run(tool.open_session(None))


def _call(tool, session, **arguments):
    return asyncio.run(tool.call(session, arguments, timeout_s=5))


def test_a_workspace_is_a_private_writable_copy_removed_at_close(base):
    ws = Workspace(base)
    assert (ws.path / "pkg" / "calc.py").read_text() == SOURCE
    assert stat.S_IMODE(os.stat(ws.path.parent).st_mode) == 0o700  # no other host user
    assert stat.S_IMODE(os.stat(ws.path / "pkg" / "calc.py").st_mode) == 0o666
    (ws.path / "pkg" / "calc.py").write_text("changed")  # an in-place write by the agent
    assert (base / "pkg" / "calc.py").read_text() == SOURCE  # never reaches the base
    assert os.stat(ws.path / "pkg" / "calc.py").st_ino != os.stat(base / "pkg" / "calc.py").st_ino
    assert ws.created_s < 1.0
    path = ws.path
    ws.close()
    ws.close()
    assert not path.exists() and not path.parent.exists()


def test_a_dropped_workspace_is_removed_too(base):
    ws = Workspace(base)
    parent = ws.path.parent
    del ws
    assert not parent.exists()


def test_view_numbers_lines_ranges_and_clips_long_files(workspace):
    tool, session = _editor(workspace)
    out = _call(tool, session, command="view", path="pkg/calc.py")
    assert (
        out.ok and "     1\tdef add(a, b):" in out.text and "     6\t    return a - b" in out.text
    )
    assert "     7" not in out.text  # the final newline is not a line
    ranged = _call(tool, session, command="view", path="/tmp/repo/pkg/calc.py", view_range=[5, -1])
    assert "     5\tdef sub" in ranged.text and "     1\t" not in ranged.text
    for bad in ([0, 2], [3, 2], [1, 99], [1], ["a", 2]):
        refused = _call(tool, session, command="view", path="pkg/calc.py", view_range=bad)
        assert not refused.ok and "view_range" in refused.text, bad
    long = _call(tool, session, command="view", path="README.md")
    assert len(long.text) < 17_000 and "grep -n" in long.text


def test_view_of_a_directory_goes_two_levels_deep_and_skips_hidden(workspace):
    tool, session = _editor(workspace)
    out = _call(tool, session, command="view", path=".")
    assert "/tmp/repo/pkg/calc.py" in out.text and "/tmp/repo/pkg/deep/" in out.text
    assert "deeper/far.py" not in out.text and ".hidden" not in out.text


def test_create_refuses_to_overwrite_and_undo_removes(workspace):
    tool, session = _editor(workspace)
    made = _call(tool, session, command="create", path="pkg/new/mod.py", file_text="y = 2\n")
    assert made.ok and (workspace.path / "pkg" / "new" / "mod.py").read_text() == "y = 2\n"
    again = _call(tool, session, command="create", path="pkg/new/mod.py", file_text="z")
    assert not again.ok and "already exists" in again.text
    assert _call(tool, session, command="undo_edit", path="pkg/new/mod.py").ok
    assert not (workspace.path / "pkg" / "new" / "mod.py").exists()


def test_str_replace_refuses_zero_or_several_matches_naming_the_lines(workspace):
    tool, session = _editor(workspace)
    none = _call(tool, session, command="str_replace", path="pkg/calc.py", old_str="a * b")
    assert not none.ok and "did not appear verbatim" in none.text
    many = _call(tool, session, command="str_replace", path="pkg/calc.py", old_str="(a, b)")
    assert not many.ok and "2 times, at lines 1, 5" in many.text
    done = _call(tool, session, command="str_replace", path="pkg/calc.py",
                 old_str="return a - b", new_str="return b - a")  # fmt: skip
    assert done.ok and "     6\t    return b - a" in done.text
    assert "return b - a" in (workspace.path / "pkg" / "calc.py").read_text()
    assert _call(tool, session, command="undo_edit", path="pkg/calc.py").ok
    assert (workspace.path / "pkg" / "calc.py").read_text() == SOURCE
    nothing = _call(tool, session, command="undo_edit", path="pkg/calc.py")
    assert not nothing.ok and "no edit" in nothing.text


def test_insert_is_range_checked_and_keeps_the_final_newline(workspace):
    tool, session = _editor(workspace)
    top = _call(tool, session, command="insert", path="pkg/calc.py", insert_line=0,
                new_str="import math")  # fmt: skip
    assert top.ok
    text = (workspace.path / "pkg" / "calc.py").read_text()
    assert text == "import math\n" + SOURCE
    end = _call(tool, session, command="insert", path="pkg/calc.py", insert_line=7, new_str="#")
    assert end.ok and (workspace.path / "pkg" / "calc.py").read_text().endswith("a - b\n#\n")
    for bad in (-1, 9, "3", True):
        out = _call(tool, session, command="insert", path="pkg/calc.py", insert_line=bad,
                    new_str="x")  # fmt: skip
        assert not out.ok and "insert_line" in out.text, bad


@pytest.mark.parametrize(
    "path", ["../base/pkg/calc.py", "/etc/passwd", "/tmp/repository/x", "pkg/../../x", "", " "]
)
def test_paths_outside_the_repository_are_refused(workspace, path):
    tool, session = _editor(workspace)
    out = _call(tool, session, command="view", path=path)
    assert not out.ok and out.error == "bad_arguments"


def test_symlinks_planted_by_the_agent_are_never_followed(workspace, tmp_path):
    secret = tmp_path / "hidden_tests.py"
    secret.write_text("SECRET = 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    # What bash in the sandbox could do to the working copy at any time:
    os.symlink(secret, workspace.path / "link.py")
    os.symlink(outside, workspace.path / "pkg" / "out")
    os.symlink("/", workspace.path / "root")
    tool, session = _editor(workspace)
    for command in (
        dict(command="view", path="link.py"),
        dict(command="view", path="root/etc/passwd"),
        dict(command="str_replace", path="link.py", old_str="SECRET", new_str="X"),
        dict(command="insert", path="link.py", insert_line=0, new_str="x"),
        dict(command="create", path="pkg/out/new.py", file_text="x"),
        dict(command="view", path="pkg/out"),
    ):
        out = _call(tool, session, **command)
        assert not out.ok and "SECRET" not in out.text, command
    assert secret.read_text() == "SECRET = 1\n" and not list(outside.iterdir())
    listing = _call(tool, session, command="view", path=".").text
    assert "/tmp/repo/root/" not in listing  # a symlinked directory is listed, not entered


def test_safe_root_writes_replace_a_symlink_instead_of_following_it(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    target = tmp_path / "target.txt"
    target.write_text("keep")
    os.symlink(target, root / "f.txt")
    files = SafeRoot(root)
    with pytest.raises(PathError):
        files.read("f.txt")
    files.write("f.txt", b"new")
    assert target.read_text() == "keep" and (root / "f.txt").read_text() == "new"
    assert not (root / "f.txt").is_symlink()


def test_non_text_and_unknown_commands_are_observations(workspace):
    (workspace.path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    tool, session = _editor(workspace)
    out = _call(tool, session, command="view", path="blob.bin")
    assert not out.ok and "UTF-8" in out.text
    out = _call(tool, session, command="delete", path="pkg/calc.py")
    assert not out.ok and "unknown command" in out.text
    asyncio.run(tool.close_session(session))
    assert _call(tool, session, command="view", path="pkg/calc.py").error == "closed"


# ------------------------------------------------------------------ FIFOs never block


def _returns_within(seconds, work, unblock):
    """Run ``work()`` in a thread: its result (or exception) and how long it took; if it is
    still running after ``seconds``, call ``unblock()`` (so the test can end) and fail."""
    outcome = []

    def run():
        try:
            outcome.append((work(), None))
        except BaseException as exc:
            outcome.append((None, exc))

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unblock()
        thread.join(10)
        pytest.fail(f"blocked for more than {seconds} s (released by opening the FIFO)")
    result, error = outcome[0]
    if error is not None:
        raise error
    return result, time.monotonic() - start


def _release(fifo):
    """Open ``fifo`` for writing and close it: a reader blocked in open() returns."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)


def test_safe_root_refuses_a_fifo_without_blocking(workspace):
    fifo = workspace.path / "pkg" / "pipe.py"
    os.mkfifo(fifo, 0o666)
    with pytest.raises(PathError, match="FIFO"):
        _returns_within(2, lambda: workspace.files.read("pkg/pipe.py"), lambda: _release(fifo))


def _gym_call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.mark.parametrize("command", ["view", "str_replace", "insert"])
def test_a_fifo_in_the_copy_is_an_observation_through_the_env(command):
    """(A guard: the editor's own type check refused this already; the race is below.)"""
    env = gym.make("VT-SWE-v0", repos=["vtutils"], split="test", max_calls_per_turn=2)
    try:
        env.reset(seed=0)
        make = "rm vtutils/stats.py && mkfifo vtutils/stats.py && ls -l vtutils/stats.py"
        obs, *_ = env.step(_gym_call("bash", command=make))
        assert "prw" in obs["text"]
        arguments = {"old_str": "x", "new_str": "y", "insert_line": 0}
        action = _gym_call("editor", command=command, path="vtutils/stats.py", **arguments)
        fifo = env.unwrapped.tools["bash"].store.active.files
        (obs, *_), seconds = _returns_within(
            5, lambda: env.step(action), lambda: _release(f"{fifo.root}/vtutils/stats.py")
        )
    finally:
        env.close()
    assert seconds < 1 and "not a regular file" in obs["text"]


DEEP = "/".join(["d"] * 1500)  # each editor call walks 1,500 directories: a window of ms


def test_a_file_swapped_for_a_fifo_mid_edit_never_blocks_the_loop():
    """The editor checks that ``T`` is a regular file, then opens it; bash, in the same
    turn, swaps ``T`` between a file and a FIFO. Before the editor opened with
    ``O_NONBLOCK`` and checked the descriptor, a swap between the two blocked its open()
    - and with it the host's event loop - forever.

    The editor's calls are synchronous, so in one turn only editor calls queued behind
    another editor call run after bash has started: the turn is [editor, bash, 4 x editor].
    Bash reaches the deep directory through a symlink (``cd`` into it alone takes 0.1 s);
    the editor walks the real path."""
    env = gym.make(
        "VT-SWE-v0", split="test", max_calls_per_turn=6, max_turns=100,
        max_episode_tokens=1 << 26, max_observation_tokens=1 << 16,
    )  # fmt: skip
    setup = (
        f"mkdir -p {DEEP} && cd {DEEP} && echo 'x = 1' > R && mkfifo F && ln R T && "
        f"ln -s /tmp/repo/{DEEP} /tmp/repo/s && cd /tmp/repo && ls s/"
    )
    swap = (
        "cd /tmp/repo; for i in $(seq 15); do "
        "ln -f s/F s/a; mv -f s/a s/T; ln -f s/R s/b; mv -f s/b s/T; done"
    )
    edit = _gym_call("editor", command="str_replace", path=f"{DEEP}/T", old_str="?", new_str="")
    first = _gym_call("editor", command="view", path="vtutils/__init__.py")
    turn = first + _gym_call("bash", command=swap) + edit * 4
    outcomes = []
    try:
        env.reset(seed=0)
        obs, *_ = env.step(_gym_call("bash", command=setup))
        assert "F" in obs["text"] and "T" in obs["text"], obs["text"]
        root = env.unwrapped.tools["bash"].store.active.files.root
        for _ in range(40):
            (obs, _, terminated, truncated, _), seconds = _returns_within(
                5, lambda: env.step(turn), lambda: _release(f"{root}/{DEEP}/F")
            )
            assert seconds < 5 and not (terminated or truncated)
            outcomes.append(obs["text"])
            if "FIFO" in obs["text"]:  # a swap landed between the check and the open
                break
    finally:
        env.close()
    assert any("FIFO" in text for text in outcomes), f"no swap hit in {len(outcomes)} turns"
