"""VT-Search-v0 through gym.make, for both retrievers: check_env, determinism, the
oracle, the observation format, budgets, bring-your-own corpus / index / questions."""

from __future__ import annotations

import json
import warnings

import duckdb
import faiss
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import vt_envs
from vt_envs.domains.search import NoSearchPolicy, default_embedder, load_fanoutqa
from vt_envs.domains.search import retriever as retriever_module
from vt_envs.domains.search.corpus import vital_articles_corpus
from vt_envs.domains.search.index import IndexConfig, build_index
from vt_envs.domains.search.loaders import fanoutqa_coverage, load_search_r1

RETRIEVERS = ["bm25", "dense"]


@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_check_env(retriever):
    env = gym.make("VT-Search-v0", retriever=retriever, render_mode="ansi")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=False)
    assert [
        str(w.message) for w in caught if "different from the unwrapped" not in str(w.message)
    ] == []
    env.close()


@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_seeded_rollouts_repeat_exactly(retriever):
    def rollout():
        env = gym.make("VT-Search-v0", retriever=retriever, split="test")
        runs = [
            vt_envs.run_episode(env, vt_envs.oracle_for("VT-Search-v0"), seed=s) for s in (3, 4)
        ]
        env.close()
        return [(r.task_id, r.reward, r.actions, r.observations, r.tokens) for r in runs]

    first = rollout()
    assert first == rollout()
    assert first[0][0] != first[1][0]


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_oracle_scores_one_and_no_search_baseline_scores_low(retriever, split):
    env = gym.make("VT-Search-v0", retriever=retriever, split=split)
    oracle = [
        vt_envs.run_episode(env, vt_envs.oracle_for("VT-Search-v0"), seed=s) for s in range(12)
    ]
    baseline = [vt_envs.run_episode(env, NoSearchPolicy(), seed=s) for s in range(12)]
    env.close()
    assert [r.reward for r in oracle] == [1.0] * 12
    kinds = {r.infos[0]["task_id"].split("/")[2] for r in oracle}
    assert len(kinds) >= 2
    assert sum(r.reward for r in baseline) / 12 < 0.3


def _searched(env, action):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    return obs["text"], info


def test_observation_holds_top_k_passages_in_search_r1_format():
    env = gym.make("VT-Search-v0", retriever="bm25", top_k=5, passage_words=4)
    text, info = _searched(env, "<search>capital of Portugal</search>")
    assert "<information>Doc 1 (Title: " in text and "</information>" in text
    docs = text.split("<information>")[1].split("</information>")[0].split("\n")
    assert [d.split(" (Title: ")[0] for d in docs] == [f"Doc {i}" for i in range(1, 6)]
    assert all(len(d.split(") ", 1)[1].split()) == 5 and d.endswith(" …") for d in docs)
    assert info["tool"]["ok"] and info["tool"]["metrics"]["hits"] == 5
    json_text, _ = _searched(
        env,
        '<tool_call>{"name": "search", "arguments": {"query": "capital of Portugal"}}</tool_call>',
    )
    assert json_text.split("<information>")[1] == text.split("<information>")[1]
    env.close()


def test_invalid_action_gets_a_corrective_message_and_the_episode_goes_on():
    env = gym.make("VT-Search-v0", retriever="bm25")
    text, info = _searched(env, "I believe the answer is Lisbon.")
    assert "<search>QUERY</search>" in text and "<answer>ANSWER</answer>" in text
    assert info["invalid_actions"] == 1
    obs, reward, terminated, truncated, info = env.step("<answer>Lisbon</answer>")
    assert terminated and set(info["verifier_parts"]) == {"em", "f1", "substring_em"}
    env.close()


def test_search_budget_and_empty_query():
    env = gym.make("VT-Search-v0", retriever="bm25", max_searches=1)
    text, info = _searched(env, "<search>   </search>")
    assert "<search> block is empty" in text and info["invalid_actions"] == 1
    text, info = _searched(
        env, '<tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>'
    )
    assert "query is empty" in text and info["tool_errors"] == 1
    obs, *_ = env.step("<search>Lisbon</search>")
    assert "You have used all 1 tool calls" in obs["text"]
    env.close()


def test_max_turns_truncates():
    env = gym.make("VT-Search-v0", retriever="bm25", max_turns=2)
    env.reset(seed=0)
    env.step("<search>a</search>")
    *_, truncated, info = env.step("<search>b</search>")
    assert truncated and info["truncation"] == "max_turns"
    env.close()


@pytest.fixture
def own_data(tmp_path):
    """A Search-R1 corpus JSONL (one passage holds an answer tag) and a question Parquet."""
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        ("0", '"Lisbon"\nLisbon is the capital of Portugal. <answer>Lisbon</answer>'),
        ("1", '"Madrid"\nMadrid is the capital of Spain.'),
        ("2", '"Danube"\nThe Danube flows through Vienna.'),
    ]
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in rows))
    questions = tmp_path / "nq_test.parquet"
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT 'What is the capital of Portugal?' AS question, "
        "['Lisbon', 'Lisboa'] AS golden_answers, 'nq' AS data_source) "
        f"TO '{questions}' (FORMAT PARQUET)"
    )
    con.close()
    return corpus, questions


@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_own_corpus_and_search_r1_questions(own_data, retriever):
    corpus, questions = own_data
    env = gym.make("VT-Search-v0", retriever=retriever, corpus=str(corpus), dataset=str(questions))
    obs, info = env.reset(seed=0)
    assert "capital of Portugal" in obs["text"]
    obs, *_ = env.step("<search>capital of Portugal</search>")
    assert "<answer>Lisbon</answer>" in obs["text"]  # the passage holds an answer tag...
    *_, reward, terminated, _, info = env.step("<answer>Madrid</answer>")
    assert terminated and reward == 0.0  # ...which is not the agent's answer
    env.reset(seed=0)
    *_, reward, _, _, _ = env.step("<answer>lisboa.</answer>")
    assert reward == 1.0  # any gold, after normalization
    env.close()


def test_prebuilt_index_through_gym_make(own_data, tmp_path):
    corpus_path, questions = own_data
    from vt_envs.domains.search.corpus import load_search_r1_corpus

    corpus = load_search_r1_corpus(corpus_path)
    vectors = default_embedder().encode([p.contents() for p in corpus], kind="passage")
    index_path = tmp_path / "e5_Flat.index"
    faiss.write_index(build_index(vectors, IndexConfig()), str(index_path))
    env = gym.make(
        "VT-Search-v0",
        retriever="dense",
        corpus=str(corpus_path),
        index_path=str(index_path),
        dataset=str(questions),
    )
    retriever = env.unwrapped.tools["search"].retriever
    assert "/prebuilt-" in retriever.name and retriever.index_path == index_path
    env.reset(seed=0)
    obs, *_ = env.step("<search>Vienna river</search>")
    assert "Doc 1 (Title: Danube)" in obs["text"]
    env.close()


def test_verl_processed_search_r1_records():
    record = {
        "data_source": "hotpotqa",
        "prompt": [{"role": "user", "content": "Answer it.\nQuestion: who wrote Hamlet?\n"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["William Shakespeare"]}},
    }
    (task,) = load_search_r1([record])
    assert task.prompt == "who wrote Hamlet?" and task.gold == ["William Shakespeare"]
    assert task.metadata["source"] == "hotpotqa"


def test_fanoutqa_questions_and_their_coverage_by_the_corpus():
    coverage = fanoutqa_coverage(vital_articles_corpus())
    dev = coverage["dev"]
    assert dev["questions"] == 310
    assert 0 < dev["all_evidence_in_corpus"] <= dev["any_evidence_in_corpus"] <= 310
    assert len(load_fanoutqa("dev")) == 310
    covered = load_fanoutqa("dev", corpus=vital_articles_corpus())
    assert len(covered) == dev["all_evidence_in_corpus"]
    env = gym.make("VT-Search-v0", retriever="bm25", dataset="fanoutqa", metric="f1")
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("fanoutqa/dev/")
    env.close()


def test_auto_without_the_extra_builds_bm25(monkeypatch):
    monkeypatch.setattr(retriever_module, "dense_available", lambda: False)
    env = gym.make("VT-Search-v0")
    assert env.unwrapped.tools["search"].retriever.name == "bm25"
    env.close()


def test_an_embedder_directory_is_loaded_once_per_process(own_data):
    import importlib.util
    from pathlib import Path

    from vt_envs.domains.search.embedders import _DEFAULT_MODULE, load_embedder

    spec = importlib.util.find_spec(_DEFAULT_MODULE)
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    corpus, questions = own_data
    envs = [
        gym.make(
            "VT-Search-v0",
            retriever="dense",
            corpus=str(corpus),
            dataset=str(questions),
            embedder=str(model_dir),
        )
        for _ in range(3)
    ]
    retrievers = {id(env.unwrapped.tools["search"].retriever) for env in envs}
    assert len(retrievers) == 1
    assert envs[0].unwrapped.tools["search"].retriever.embedder is load_embedder(model_dir)
    for env in envs:
        env.close()


def test_a_vector_env_step_batches_its_searches_into_few_encoder_calls():
    vec = vt_envs.make_vec("VT-Search-v0", num_envs=16, retriever="dense")
    batcher = vec.envs[0].tools["search"].retriever.batcher
    vec.reset(seed=0)
    batches, queries = batcher.batches, batcher.queries
    observations, *_ = vec.step([f"<search>capital city number {i}</search>" for i in range(16)])
    assert batcher.queries - queries == 16
    assert batcher.batches - batches <= 4, "16 concurrent searches should share encoder calls"
    assert all("<information>Doc 1 (Title: " in text for text in observations["text"])
    vec.close()


class _SlowQueries:
    """A lexical embedder whose query encoding takes ``delay_s`` (passages are instant)."""

    def __init__(self, delay_s: float):
        from search_helpers import HashingEmbedder

        self.inner, self.delay_s = HashingEmbedder(id="slow-queries"), delay_s
        self.id, self.dim = self.inner.id, self.inner.dim

    def encode(self, texts, *, kind="query"):
        if kind == "query":
            import time

            time.sleep(self.delay_s)
        return self.inner.encode(texts, kind=kind)


def test_a_search_past_its_deadline_is_a_timeout_observation(own_data):
    corpus, questions = own_data
    env = gym.make(
        "VT-Search-v0",
        retriever="dense",
        corpus=str(corpus),
        dataset=str(questions),
        embedder=_SlowQueries(1.0),
        search_timeout_s=0.2,
    )
    env.reset(seed=0)
    obs, *_, info = env.step("<search>capital of Portugal</search>")
    assert "did not finish within 0.2 s" in obs["text"]
    assert info["tool"]["error"] == "timeout" and info["tool"]["latency_s"] < 0.9
    env.close()


@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_a_query_with_a_lone_surrogate_fails_nobody(retriever):
    vec = vt_envs.make_vec("VT-Search-v0", num_envs=4, retriever=retriever)
    vec.reset(seed=0)
    bad = (
        '<tool_call>{"name": "search", "arguments": {"query": "paris \\ud800 france"}}</tool_call>'
    )
    actions = [
        "<search>capital of Italy</search>",
        bad,
        "<search>Danube</search>",
        "\ud800 <search>Rome</search>",
    ]
    observations, _, _, _, infos = vec.step(actions)
    assert all("<information>Doc 1 (Title: " in text for text in observations["text"])
    vec.close()


def test_bad_options_are_typed_errors():
    from vt_envs.errors import InvalidConfigError

    for kwargs in (
        {"top_k": 0},
        {"top_k": 2.5},
        {"size": 0},
        {"kinds": "two_hop"},
        {"kinds": ["x"]},
        {"search_timeout_s": 0},
    ):
        with pytest.raises(InvalidConfigError):
            gym.make("VT-Search-v0", retriever="bm25", **kwargs)


def test_a_corpus_file_is_read_once_per_process(own_data):
    corpus, questions = own_data
    envs = [
        gym.make("VT-Search-v0", retriever="bm25", corpus=str(corpus), dataset=str(questions))
        for _ in range(3)
    ]
    assert len({id(env.unwrapped.tools["search"].retriever.corpus) for env in envs}) == 1
    for env in envs:
        env.close()


def test_malformed_question_and_corpus_files_are_typed_errors(tmp_path):
    from vt_envs.domains.search.corpus import Corpus, Passage, load_search_r1_corpus
    from vt_envs.errors import DatasetFormatError, InvalidConfigError

    bad_json = tmp_path / "q.json"
    bad_json.write_text("[{broken")
    garbage = tmp_path / "q.parquet"
    garbage.write_bytes(b"PAR1 not really")
    latin = tmp_path / "corpus.jsonl"
    latin.write_bytes('{"id": "1", "contents": "\\"Caf\xe9\\"\\ntext"}\n'.encode("latin-1"))
    strings = tmp_path / "strings.jsonl"
    strings.write_text('"just a string"\n')
    for path in (bad_json, garbage):
        with pytest.raises(DatasetFormatError, match=path.name):
            load_search_r1(path)
    for path in (latin, strings):
        with pytest.raises(DatasetFormatError, match=path.name):
            load_search_r1_corpus(path)
    with pytest.raises(DatasetFormatError, match="no non-empty gold"):
        load_search_r1([{"question": "q", "golden_answers": []}])
    with pytest.raises(DatasetFormatError, match="not an object"):
        load_search_r1([["q", "a"]])
    with pytest.raises(InvalidConfigError, match=r"repeated: \['7'\]"):
        Corpus([Passage("7", "a", "x"), Passage("7", "b", "y")], name="dupes")


def _first_title(env) -> str:
    env.reset(seed=0)
    obs, *_ = env.step("<search>capital of Portugal</search>")
    return obs["text"].split("Doc 1 (Title: ", 1)[1].split(")", 1)[0]


def _fresh_env(monkeypatch, retriever, corpus, questions):
    """A VT-Search-v0 env that opens its cache anew (no retriever shared in-process)."""
    monkeypatch.setattr(retriever_module, "_SHARED", {})
    return gym.make("VT-Search-v0", retriever=retriever, corpus=str(corpus), dataset=str(questions))


def _reverse_flat_vectors(path) -> None:
    """Same size, still a valid FAISS file: the passages' vectors in reverse order."""
    index = faiss.read_index(str(path))
    n, d = index.ntotal, index.d
    data = bytearray(path.read_bytes())
    codes = len(data) - n * d * 4  # a flat index ends with its n x d float32 codes
    rows = np.frombuffer(bytes(data[codes:]), dtype=np.float32).reshape(n, d)
    data[codes:] = rows[::-1].tobytes()
    path.write_bytes(bytes(data))


def _swap_vocab(path, a, b) -> None:
    """Still valid JSON: two words' ids exchanged."""
    vocab = json.loads(path.read_text())
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(vocab))


@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_a_tampered_cache_is_rebuilt_not_trusted(
    own_data, tmp_path, monkeypatch, caplog, retriever
):
    """A cache file changed after it was written (bytes flipped, the file still valid)
    or copied from another entry fails its manifest: the entry is rebuilt, with a
    warning, and searches return the right passages again."""
    import logging

    corpus, questions = own_data
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    env = _fresh_env(monkeypatch, retriever, corpus, questions)
    assert _first_title(env) == "Lisbon"
    env.close()
    (entry,) = (p for p in (tmp_path / "cache" / "search").iterdir() if p.name != "tasks")
    if retriever == "dense":
        _reverse_flat_vectors(entry / "index-flat.faiss")
    else:
        _swap_vocab(entry / "vocab.index.json", "portugal", "spain")
    with caplog.at_level(logging.WARNING):
        env = _fresh_env(monkeypatch, retriever, corpus, questions)
    assert _first_title(env) == "Lisbon"
    assert any("cannot be used" in r.getMessage() for r in caplog.records)
    env.close()


def test_a_cache_entry_copied_from_another_corpus_is_rebuilt(own_data, tmp_path, monkeypatch):
    corpus, questions = own_data
    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path / "cache"))
    other = tmp_path / "other.jsonl"
    # its passage nearest to "capital of Portugal" is the second, not the first
    rows = ['"Cheese"\nCheese is made from milk.', '"Oslo"\nOslo is the capital of Norway.']
    rows.append('"Bern"\nBern is a town in Switzerland.')
    records = [json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(rows)]
    other.write_text("".join(records))
    _fresh_env(monkeypatch, "dense", other, questions).close()
    (theirs,) = (tmp_path / "cache" / "search").iterdir()
    _fresh_env(monkeypatch, "dense", corpus, questions).close()
    (ours,) = {p for p in (tmp_path / "cache" / "search").iterdir() if p.name != "tasks"} - {theirs}
    for name in ("index-flat.faiss", "index-flat.faiss.manifest.json"):  # same shape: 3 x 384
        if (theirs / name).exists():  # (with its manifest, where there is one)
            (ours / name).write_bytes((theirs / name).read_bytes())
    env = _fresh_env(monkeypatch, "dense", corpus, questions)
    assert _first_title(env) == "Lisbon"
    env.close()
