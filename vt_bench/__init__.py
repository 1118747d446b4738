"""VT benchmarks and evaluation. Run ``python -m vt_bench --help`` for the commands."""
