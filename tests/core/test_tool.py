"""Tool deadlines: every deadline that enters VT is a finite number of seconds > 0.

One NaN that reached the library's event loop would break its timer heap (a NaN
``when`` compares false with every other, so timers of *other* sessions queued
behind it stop firing in order); these tests pin that none gets there.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from vt_envs.core.tool import MAX_TIMEOUT_S, check_timeout
from vt_envs.errors import InvalidConfigError
from vt_envs.tools.python import PythonTool

BAD = [math.nan, math.inf, -math.inf, -1.0, 0, 0.0, MAX_TIMEOUT_S * 2, "10", True, None, [1]]


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_bad_deadline_is_refused_naming_it_and_the_fix(value):
    with pytest.raises(InvalidConfigError) as caught:
        check_timeout("python_timeout_s", value)
    message = str(caught.value)
    assert "python_timeout_s" in message and repr(value) in message
    assert "python_timeout_s=10.0" in message  # the fix


def test_good_deadlines_pass_as_floats():
    import numpy as np

    assert check_timeout("t", 3) == 3.0 and type(check_timeout("t", 3)) is float
    assert check_timeout("t", np.float32(0.5)) == 0.5
    assert check_timeout("t", MAX_TIMEOUT_S) == MAX_TIMEOUT_S
    assert check_timeout("t", None, optional=True) is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -2.0, 0.0], ids=repr)
def test_a_tool_refuses_a_bad_timeout_at_init_and_later(value):
    with pytest.raises(InvalidConfigError, match="timeout_s"):
        PythonTool(timeout_s=value)
    tool = PythonTool(timeout_s=5.0)
    with pytest.raises(InvalidConfigError, match="timeout_s"):
        tool.timeout_s = value
    assert tool.timeout_s == 5.0


def _nan_timers(loop: asyncio.AbstractEventLoop) -> list:
    return [h for h in loop._scheduled if math.isnan(h.when())]


@pytest.mark.asyncio
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0], ids=repr)
async def test_a_per_call_deadline_never_reaches_the_shared_timer_heap(value):
    """A call given a NaN deadline raises before anything runs, and leaves no NaN timer
    on the loop: a second session's call with a real deadline still times out on time."""
    loop = asyncio.get_running_loop()
    tool = PythonTool(timeout_s=5.0)
    try:
        bad, other = await tool.open_session(None), await tool.open_session(None)
        slow = asyncio.ensure_future(
            tool.call(other, {"code": "import time\ntime.sleep(60)"}, timeout_s=1.0)
        )
        await asyncio.sleep(0.3)  # the slow call is running, under its 1 s deadline
        with pytest.raises(InvalidConfigError, match="timeout_s"):
            await tool.call(bad, {"code": "print(1)"}, timeout_s=value)
        assert _nan_timers(loop) == []
        result = await asyncio.wait_for(slow, 20)
        assert result.error == "timeout", result
        fine = await tool.call(bad, {"code": "print(1)"})  # the session is still usable
        assert fine.text == "1"
        await tool.close_session(bad)
        await tool.close_session(other)
    finally:
        await tool.aclose()


def test_the_sql_watchdog_refuses_a_nan_alarm_and_keeps_firing_the_others():
    """The SQL worker's watchdog is shared by every connection of its process: a NaN
    alarm would make its wake-up time NaN (a busy loop); it is refused instead."""
    import time

    import duckdb

    from vt_envs.domains.sql.execution import _WATCHDOG, execute_query

    con = duckdb.connect()
    for value in (math.nan, math.inf, 0.0, -1.0):
        with pytest.raises(ValueError, match="timeout_s"):
            _WATCHDOG.arm(con, value)
    slow = "SELECT count(*) FROM range(100000000000) a"
    start = time.monotonic()
    outcome = execute_query(con, slow, timeout_s=0.3)
    assert outcome.error == "timeout", outcome
    assert time.monotonic() - start < 10
