"""``vt-bench eval``: evaluation of a policy over VT env ids, with crash-safe records,
resume, pass@k with intervals, and a Markdown report with plots.

- :mod:`~vt_bench.evals.policies`: what ``--policy`` names;
- :mod:`~vt_bench.evals.openai_api`: OpenAI-compatible endpoints (chat, completions);
- :mod:`~vt_bench.evals.runner`: planning and playing the rollouts;
- :mod:`~vt_bench.evals.records`: the per-rollout JSONL file;
- :mod:`~vt_bench.evals.metrics`: pass@k, intervals, per-env summaries;
- :mod:`~vt_bench.evals.report`: ``REPORT.md`` and its plots;
- :mod:`~vt_bench.evals.cli`: the command line.
"""
