"""Smoke test of ``python -m vt_bench search-speed`` (tiny sizes, no timing claims)."""

from __future__ import annotations

import argparse
import json

from vt_bench import search_speed


def test_search_speed_runs_and_writes_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    search_speed.add_arguments(parser)
    tiny = ["--queries", "6", "--repeats", "2", "--concurrency", "3", "--embed-sample", "8"]
    tiny += ["--sizes", "3000", "--scale-queries", "6", "--batch", "4", "--tasks", "12"]
    args = parser.parse_args([*tiny, "--hnsw-budget-s", "0", "--out", str(tmp_path)])
    assert search_speed.main(args) == 0
    report = json.loads((tmp_path / "search_speed.json").read_text())
    build = report["build"]
    assert build["embedding"]["sample"] == 8 and build["embedding"]["dim"] == 384
    assert set(build["indexes"]) == {"flat", "hnsw", "ivf"}
    assert build["bm25"]["build_s"] > 0  # built cold, into a temporary cache
    queries = report["queries"]
    assert queries["queries"] == 6
    for name in ("dense", "bm25"):
        assert queries[name]["search"]["n"] == 12  # 6 queries x 2 repeats
        assert queries[name]["asearch_concurrent"]["concurrency"] == 3
        assert 1 <= queries[name]["asearch_concurrent"]["mean_batch"] <= 3
    corpus, synthetic = report["scale"]
    assert corpus["source"] == "corpus" and corpus["passages"] == build["passages"]
    assert synthetic["source"] == "synthetic" and synthetic["passages"] == 3000
    for point in report["scale"]:
        flat = point["indexes"]["flat"]
        assert flat["recall_at_3"] == flat["recall_at_10"] == 1.0  # flat is the reference
        assert all(0 <= f["recall_at_10"] <= 1 for f in point["indexes"].values())
    # A zero budget: the second size's HNSW uses the fallback parameters, and says so.
    hnsw = synthetic["indexes"]["hnsw"]
    assert hnsw["fallback"] and hnsw["params"]["m"] == search_speed.HNSW_FALLBACK["hnsw_m"]
    recall = report["recall"]
    assert recall["held_out_candidates"] == recall["all"]["n"] == 12
    assert {"masked_subject", "year_cloze", "two_hop"} <= set(recall)  # every kind kept
    assert report["machine"]["faiss_omp_threads"] >= 1
    out = capsys.readouterr().out
    assert "| dense | asearch, gathered | 3 |" in out and "(fallback)" in out
