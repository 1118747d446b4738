"""The worker side of :mod:`vt_bench.peers.ab` (stdlib only: it runs in peers' venvs).

``serve(setup, run)``: ``setup(params) -> state`` once; ``run(state, n) -> (items,
check)`` per round, timed here (or ``(items, check, seconds)`` when the worker times
only part of its run, as a trainer timing its steps and not its start-up does, or
``(items, check, seconds, phases)`` with ``phases`` the seconds of each named part).
Anything the libraries print goes to stderr, so stdout carries only the replies.
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def serve(setup, run) -> None:
    replies = sys.stdout
    sys.stdout = sys.stderr
    state = None
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if message["op"] == "quit":
                break
            if message["op"] == "setup":
                state = setup(message["params"])
                reply = {"ok": True}
            else:
                start = time.perf_counter()
                items, check, *timed = run(state, int(message["n"]))
                seconds = timed[0] if timed else time.perf_counter() - start
                reply = {"seconds": seconds, "items": items, "check": check}
                if len(timed) > 1:
                    reply["phases"] = timed[1]
        except Exception:  # reported to the driver, which raises it
            reply = {"error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
