"""The worker side of :mod:`vt_bench.peers.ab` (stdlib only: it runs in peers' venvs).

``serve(setup, run)``: ``setup(params) -> state`` once; ``run(state, n) -> (items,
check)`` per round, timed here. Anything the libraries print goes to stderr, so
stdout carries only the replies.
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
                items, check = run(state, int(message["n"]))
                reply = {"seconds": time.perf_counter() - start, "items": items, "check": check}
        except Exception:  # reported to the driver, which raises it
            reply = {"error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
