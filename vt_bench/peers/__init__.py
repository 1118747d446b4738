"""VT next to its peers, on the same work: ``python -m vt_bench peers-speed --peers DIR``.

Nothing is installed here: a peer is measured when its virtualenv exists under
``DIR`` (``DIR/skyrl``: skyrl-gym; ``DIR/gem``: gem-llm; made as docs/benchmarks.md
shows) and imports. Each comparison runs one long-lived
worker process per side (:mod:`~vt_bench.peers.ab`): VT's in this interpreter,
the peer's in its own venv, both given the same inputs (written by
:mod:`~vt_bench.peers.work`); rounds alternate which side goes first, each side
times its own work inside its process, and the ratio is of the medians.
"""
