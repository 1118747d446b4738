"""VT-Search-v0 as a benchmark (issue 31): golds are the title and true aliases only,
the task set does not depend on the retriever, multi-hop questions never contradict
their gold, closed-book-answerable questions are out, and the oracle on a user's
questions answers only from what it read."""

from __future__ import annotations

import collections
import json

import duckdb
import gymnasium as gym
import pytest

import vt_envs
from vt_envs.domains.search import tasks as tasks_module
from vt_envs.domains.search.bridges import Bridges, bridge_tasks
from vt_envs.domains.search.candidates import aliases, is_person
from vt_envs.domains.search.corpus import Corpus, Passage, vital_articles_corpus
from vt_envs.domains.search.tasks import (
    CLOSED_BOOK_FILE,
    RETRIEVAL_FILE,
    shipped_filter,
)

# A word of the title that the review found scoring 1.0 (a held-out article each).
PARTIAL_SPANS = {
    "1911 Revolution": "Revolution",
    "1973 oil crisis": "1973",
    "Afonso I of Portugal": "Portugal",
    "East China Sea": "China",
    "The Walt Disney Company": "Company",
}


def _candidates():
    # the process's one generation, which gym.make uses too
    return tuple(tasks_module._all_candidates(vital_articles_corpus()))


def _answer(env, task_id: str, answer: str) -> float:
    env.reset(options={"task_id": task_id})
    *_, reward, terminated, _, _ = env.step(f"<answer>{answer}</answer>")
    assert terminated
    return reward


def test_a_part_of_the_title_scores_zero_and_the_title_one_through_gym_make():
    env = gym.make("VT-Search-v0", retriever="bm25", split="test")
    by_title = {
        t.gold[0]: t.id for t in env.unwrapped.tasks if t.metadata["kind"] == "masked_subject"
    }
    for title, part in PARTIAL_SPANS.items():
        assert title in by_title, title
        assert _answer(env, by_title[title], part) == 0.0, (title, part)
        assert _answer(env, by_title[title], title) == 1.0, title
    # True aliases still count: the stated name, the surname the summary uses alone.
    assert _answer(env, by_title["The Walt Disney Company"], "Disney") == 1.0
    env.close()


def test_golds_are_the_title_without_qualifier_stated_names_and_surnames():
    def golds(title, text):
        return aliases(Passage("x", title, text))

    assert golds("Mercury (planet)", "Mercury is the first planet from the Sun.") == (
        "Mercury (planet)",
        "Mercury",
    )
    assert golds(
        "1911 Revolution",
        "The 1911 Revolution, also known as the Xinhai Revolution or Hsinhai Revolution, "
        "ended the Qing dynasty.",
    ) == ("1911 Revolution", "Xinhai Revolution", "Hsinhai Revolution")
    einstein = Passage(
        "e",
        "Albert Einstein",
        "Albert Einstein was a German-born physicist. He developed relativity. "
        "Einstein also made contributions to quantum theory.",
    )
    assert is_person(einstein) and aliases(einstein) == ("Albert Einstein", "Einstein")
    afonso = Passage(
        "a", "Afonso I of Portugal", "Afonso I was the first king of Portugal. He won."
    )
    assert not is_person(afonso) and aliases(afonso) == ("Afonso I of Portugal",)


def test_no_masked_subject_gold_is_a_bare_part_of_its_title_unless_the_opening_states_it():
    corpus = vital_articles_corpus()
    for c in _candidates():
        if c.kind != "masked_subject":
            continue
        opening = corpus[c.passage].text.split(". ")[0]
        for gold in c.golds[1:]:
            # every further gold is written in the opening (a stated name), or is the
            # title's own base form or a person's surname
            assert gold in opening or gold in c.golds[0] or gold in corpus[c.passage].text, c.golds


@pytest.mark.slow
def test_the_held_out_task_ids_are_the_same_with_either_retriever():
    ids = {}
    for retriever in ("dense", "bm25"):
        env = gym.make("VT-Search-v0", retriever=retriever, split="test")
        ids[retriever] = [t.id for t in env.unwrapped.tasks]
        env.close()
    assert ids["dense"] == ids["bm25"] and len(ids["bm25"]) > 900


def test_the_default_corpus_uses_the_shipped_filters_and_never_retrieves_to_choose(monkeypatch):
    corpus = vital_articles_corpus()
    for split in ("train", "test"):
        assert shipped_filter(RETRIEVAL_FILE, corpus, _candidates(), split) is not None, (
            f"{RETRIEVAL_FILE} is stale: rerun scripts/search_task_filter.py"
        )
    if _closed_book_path().is_file():
        assert shipped_filter(CLOSED_BOOK_FILE, corpus, _candidates(), "test") is not None, (
            f"{CLOSED_BOOK_FILE} is stale: rerun scripts/search_closed_book.py"
        )

    def no_retrieval(*args, **kwargs):
        raise AssertionError("the default corpus's task set must not depend on a retriever")

    monkeypatch.setattr(tasks_module, "retrievable", no_retrieval)
    monkeypatch.setattr(tasks_module, "_TASKS", {})
    env = gym.make("VT-Search-v0", retriever="bm25", split="test")
    assert len(env.unwrapped.tasks) > 900
    env.close()


def _closed_book_path():
    return tasks_module.resources.files("vt_envs") / "assets" / "search" / CLOSED_BOOK_FILE


def test_closed_book_answered_tasks_are_not_in_the_held_out_set():
    if not _closed_book_path().is_file():
        pytest.skip(f"{CLOSED_BOOK_FILE} not computed yet: run scripts/search_closed_book.py")
    data = json.loads(_closed_book_path().read_text())
    answered = {f"search/test/{key}" for key in data["splits"]["test"]["answered"]}
    assert answered, "the closed-book model answers some held-out candidates"
    env = gym.make("VT-Search-v0", retriever="bm25", split="test")
    ids = {t.id for t in env.unwrapped.tasks}
    env.close()
    assert not ids & answered
    assert answered <= {c.id for c in _candidates()}


def test_multi_hop_tasks_number_hundreds_and_never_contradict_their_gold():
    counts = collections.Counter(c.kind for c in _candidates() if c.kind.startswith("two_hop"))
    assert sum(counts.values()) >= 300 and len(counts) == 3, counts
    demonyms = {c.golds[0] for c in _candidates() if c.kind == "two_hop"}
    for c in _candidates():
        if c.kind == "two_hop":
            quoted = c.question.split('"')[3]
            assert not {w for w in demonyms if f"{w} " in quoted} - {c.golds[0]}, c.question


def test_a_question_stating_another_nationality_is_dropped():
    corpus = Corpus(
        [
            Passage(
                "0", "Klemens Metternich", "Klemens Metternich was a German statesman. He led."
            ),
            Passage("1", "Franz Liszt", "Franz Liszt was a Hungarian composer. He played."),
            Passage("3", "Joseph Haydn", "Joseph Haydn was an Austrian composer. He wrote."),
            Passage(
                "2",
                "Congress of Vienna",
                "The Austrian statesman Klemens Metternich chaired the congress in Vienna. "
                "Franz Liszt was not yet born when the congress met in Vienna.",
            ),
        ],
        name="bridges",
    )
    found = bridge_tasks(3, corpus[3], Bridges(corpus))
    assert [c.golds for c in found] == [("Hungarian",)]  # not Metternich "German"


def test_the_oracle_on_user_questions_searches_and_answers_only_from_what_it_read(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [("0", '"Lisbon"\nLisbon is the capital of Portugal.'), ("1", '"Madrid"\nMadrid.')]
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in rows))
    questions = tmp_path / "q.parquet"
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT * FROM (VALUES ('What is the capital of Portugal?', ['Lisbon']), "
        "('What is the capital of Norway?', ['Oslo'])) t(question, golden_answers)) "
        f"TO '{questions}' (FORMAT PARQUET)"
    )
    con.close()
    env = gym.make("VT-Search-v0", retriever="bm25", corpus=str(corpus), dataset=str(questions))
    results = {}
    for task in env.unwrapped.tasks:
        run = vt_envs.run_episode(
            env, vt_envs.oracle_for("VT-Search-v0"), options={"task_id": task.id}
        )
        assert run.actions[0].startswith("<search>"), run.actions
        results[task.gold[0]] = run.reward
    env.close()
    assert results == {"Lisbon": 1.0, "Oslo": 0.0}  # Oslo is in no passage it read


def test_candidates_are_cached_on_disk_and_read_back_unchanged(tmp_path, monkeypatch):
    """A second process reads the generated candidates from the cache (seconds, not the
    ~40 s generation) and gets exactly what generating them gives; a tampered cache
    file is regenerated."""
    from vt_envs.domains.search import tasks as search_tasks_module
    from vt_envs.domains.search.tasks import _cached_candidates, candidate_tasks

    monkeypatch.setenv("VT_CACHE_DIR", str(tmp_path))
    corpus = Corpus(
        [
            Passage("0", "Paris", "Paris is the capital and largest city of France."),
            Passage("1", "France", "France is a country in Western Europe. Its capital is Paris."),
            Passage("2", "Rome", "Rome was founded in 753 BC. It is the capital of Italy."),
            Passage("3", "Italy", "Italy is a country in Southern Europe."),
        ],
        name="tiny",
    )
    fresh = candidate_tasks(corpus)
    assert fresh, "the tiny corpus gives candidates"
    assert _cached_candidates(corpus) == fresh  # generated, then written
    monkeypatch.setattr(search_tasks_module, "candidate_tasks", lambda c: pytest.fail("regen"))
    assert _cached_candidates(corpus) == fresh  # read back, not generated
    (cached,) = [
        p for p in (tmp_path / "search" / "tasks").glob("*.json") if "manifest" not in p.name
    ]
    cached.write_text(cached.read_text().replace('"golds": [', '"golds": ["forged", ', 1))
    monkeypatch.setattr(search_tasks_module, "candidate_tasks", lambda c: fresh)
    assert _cached_candidates(corpus) == fresh  # the manifest refused the altered file
