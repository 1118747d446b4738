"""Running the tool calls of one action, for :class:`~vt_envs.core.env.ToolEnv`.

Each call gets a deadline, the tool's ``timeout_s`` cut to what is left of
``max_episode_seconds``; the tool enforces it itself and the env's timer is a
backstop at the deadline plus the tool's ``grace_s`` (see
:mod:`vt_envs.core.tool`). Calls to different sessions overlap; calls to one
session that takes one call at a time queue on its lock, in the order the
action wrote them. A failure of any kind (tool error, timeout, a tool that
raised, a session that could not be recovered) comes back as a failed
:class:`~vt_envs.core.tool.ToolResult` the agent reads, never as an exception;
only the step's own cancellation (``close()``, Ctrl-C) propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vt_envs.core.episode import Episode, OpenSessions, tool_calls_left
from vt_envs.core.images import frozen_image
from vt_envs.core.parser import ParseResult, ToolCall
from vt_envs.core.tokenizer import IMAGE_MARK, ChatTokenizer
from vt_envs.core.tool import Tool, ToolResult

__all__ = ["cap_observation", "invalid_feedback", "run_calls"]

# The env's logger: these records have always come from vt_envs.core.env.
logger = logging.getLogger("vt_envs.core.env")


async def run_calls(
    episode: Episode,
    calls: Sequence[ToolCall],
    *,
    tools: Mapping[str, Tool],
    live: OpenSessions,
    max_tool_calls: int | None,
    max_episode_seconds: float | None,
    cap: Callable[[str], str],
    image_env: bool,
) -> tuple[str, list[dict[str, Any]], list[np.ndarray]]:
    """Run an action's calls (no more than ``max_tool_calls`` leaves) in the sessions
    of ``live``; count them in ``episode``; return the observation text (each result
    ``cap``-ped, joined by newlines), the calls' infos and (``image_env``) the images
    the results added, marked in the text where they go."""
    calls = list(calls)[: tool_calls_left(episode, max_tool_calls)]
    # Calls to different sessions overlap; calls to one session queue on its
    # lock in the order written (asyncio.Lock is FIFO; gather starts them in order).
    results = await asyncio.gather(
        *(_run_call(episode, tools, live, call, max_episode_seconds) for call in calls)
    )
    texts, infos, images = [], [], []
    for call, (result, latency) in zip(calls, results):
        episode.tool_calls += 1
        episode.tool_errors += not result.ok
        text = cap(result.text)
        if image_env:
            text = text.replace(IMAGE_MARK, "")
            for image in result.images:
                images.append(frozen_image(image))
                text += "\n" + IMAGE_MARK
        texts.append(text)
        infos.append(
            {
                "name": call.name,
                "ok": result.ok,
                "error": result.error,
                "latency_s": latency,
                "metrics": dict(result.metrics),
                **({"ends_episode": result.ends_episode} if result.ends_episode else {}),
            }
        )
    return "\n".join(texts), infos, images


async def _run_call(
    episode: Episode,
    tools: Mapping[str, Tool],
    live: OpenSessions,
    call: ToolCall,
    max_episode_seconds: float | None,
) -> tuple[ToolResult, float]:
    tool = tools[call.name]
    lock = episode.locks.get(call.name)
    async with lock if lock is not None else contextlib.nullcontext():
        if call.name in episode.broken:
            return _unavailable(call.name), 0.0
        timeout = tool.timeout_s
        if max_episode_seconds is not None:
            left = max_episode_seconds - (time.monotonic() - episode.started)
            if left <= 0:
                return _out_of_time(call.name), 0.0
            timeout = min(timeout, left)
        start = time.monotonic()
        result = await _call_with_backstop(episode, live, tool, call, timeout)
        return result, time.monotonic() - start


async def _call_with_backstop(
    episode: Episode, live: OpenSessions, tool: Tool, call: ToolCall, timeout: float
) -> ToolResult:
    """Run one call under its deadline; the env's timer fires only at deadline + grace."""
    session = live.sessions.get(call.name)
    running = asyncio.ensure_future(tool.call(session, call.arguments, timeout_s=timeout))
    try:
        done, _ = await asyncio.wait({running}, timeout=timeout + tool.grace_s)
    except BaseException:  # this step itself was cancelled: close(), Ctrl-C, step_wait
        await _cancel_and_wait(running, tool.grace_s)
        raise
    if not done:
        logger.warning(
            "tool %s overran its %.3g s deadline by %.3g s; cancelling the call",
            call.name,
            timeout,
            tool.grace_s,
        )
        await _cancel_and_wait(running, tool.grace_s)
        if not (running.done() and await _recover(tool, session)):
            episode.broken.add(call.name)
            return _unavailable(call.name)
        return ToolResult.failure(
            f"Error: the {call.name} call did not finish within {timeout:.3g} s and was "
            "stopped; its session was reset.",
            "timeout",
        )
    try:
        return running.result()
    except (Exception, asyncio.CancelledError) as exc:  # a tool bug must not end the episode
        logger.error("tool %s raised %r", call.name, exc, exc_info=exc)
        return ToolResult.failure(
            f"Error: the {call.name} tool failed ({type(exc).__name__}).", "internal_error"
        )


def cap_observation(text: str, tokenizer: ChatTokenizer, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens, with a note of how many more
    there were; unchanged when it fits."""
    ids = tokenizer.encode_text(text)
    if len(ids) <= max_tokens:
        return text
    kept = tokenizer.decode(ids[:max_tokens])
    cut = len(ids) - max_tokens
    return f"{kept}\n... [output truncated: {cut} more tokens not shown]"


def invalid_feedback(parse: ParseResult, max_tool_calls: int | None, answer_tag: str) -> str:
    """The observation for an action that ran no call: the parser's explanation, or
    (a valid call once the tool budget is spent) a request for the final answer."""
    if parse.kind == "tool_call":  # a valid call, but the tool budget is spent
        return (
            f"You have used all {max_tool_calls} tool calls. "
            f"Give your final answer now with <{answer_tag}>...</{answer_tag}>."
        )
    # The parser's message may quote the action: an image mark in it is not an image.
    return (parse.message or "Invalid action.").replace(IMAGE_MARK, "")


async def _cancel_and_wait(task: asyncio.Future, timeout: float) -> None:
    """Cancel ``task`` and give it ``timeout`` seconds to unwind (kill, interrupt, reap)."""
    task.cancel()
    await asyncio.wait({task}, timeout=timeout)


async def _recover(tool: Tool, session: Any) -> bool:
    """Run the tool's recovery hook for ``session``, bounded by its grace; ``True`` on success."""
    try:
        await asyncio.wait_for(tool.recover_session(session), tool.grace_s)
        return True
    except (Exception, asyncio.TimeoutError) as exc:
        logger.warning("recovering the %s session failed: %r", tool.name, exc)
        return False


def _unavailable(name: str) -> ToolResult:
    return ToolResult.failure(
        f"Error: the {name} tool is unavailable for the rest of this episode (an earlier "
        "call could not be stopped).",
        "unavailable",
    )


def _out_of_time(name: str) -> ToolResult:
    return ToolResult.failure(
        f"Error: the {name} call was not run: the episode's time budget is spent.", "timeout"
    )
