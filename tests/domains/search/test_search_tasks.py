"""Generated search tasks: answers never in the question, two hops really two,
a fixed held-out split by article, and the retrieval check."""

from __future__ import annotations

import collections

from search_helpers import HashingEmbedder

from vt_envs.domains.search.corpus import vital_articles_corpus
from vt_envs.domains.search.retriever import DenseRetriever, shared_retriever
from vt_envs.domains.search.tasks import (
    TASK_KINDS,
    Candidate,
    _all_candidates,
    candidate_tasks,
    retrievable,
    search_tasks,
    split_of,
)
from vt_envs.domains.search.verifier import normalize_answer


def _candidates() -> tuple[Candidate, ...]:
    # the process's one generation (gym.make uses it too)
    return tuple(_all_candidates(vital_articles_corpus()))


def _has(text: str, phrase: str) -> bool:
    return f" {normalize_answer(phrase)} " in f" {normalize_answer(text)} "


def test_generation_is_deterministic_and_has_every_kind_in_both_splits():
    corpus = vital_articles_corpus()
    assert candidate_tasks(corpus) == list(_candidates())
    counts = collections.Counter((c.kind, c.split) for c in _candidates())
    for kind in TASK_KINDS:
        assert counts[kind, "train"] > 50 and counts[kind, "test"] >= 3, counts


def test_no_answer_appears_in_its_question():
    for c in _candidates():
        assert not any(_has(c.question, g) for g in c.golds), (c.id, c.golds)


def test_answers_are_in_the_gold_passages_and_two_hops_need_both():
    corpus = vital_articles_corpus()
    for c in _candidates():
        first = corpus[c.gold_passages[0]]
        if c.kind == "masked_subject":
            assert first.title == c.golds[0]
        elif c.kind == "year_cloze":
            assert c.golds[0] in first.text
        else:
            second = corpus[c.gold_passages[1]]
            assert not _has(first.text, c.golds[0])  # hop 1 alone cannot answer
            assert _has(second.text, c.golds[0])
            assert c.queries[1] in first.text  # hop 1 names which article to search next


def test_the_held_out_split_is_about_one_article_in_ten_for_every_kind():
    by_article = collections.defaultdict(set)
    for c in _candidates():
        by_article[c.passage].add(c.split)
        if split_of(vital_articles_corpus()[c.passage].title) == "test":
            assert c.split == "test"  # (an article a held-out two-hop task reads is held out too)
    assert all(len(splits) == 1 for splits in by_article.values())
    held_out = sum("test" in s for s in by_article.values()) / len(by_article)
    assert 0.07 < held_out < 0.13


def test_the_retrieval_check_drops_tasks_whose_query_misses(small_corpus, tmp_path):
    dense = DenseRetriever(small_corpus, HashingEmbedder(), cache=tmp_path, progress=False)
    hits_lisbon = Candidate("year_cloze", "test", 4, "q", ("x",), ("Portugal Tagus",), (4,))
    misses = Candidate("year_cloze", "test", 0, "q", ("x",), ("Portugal Tagus",), (0,))
    two_hop_miss = Candidate(
        "two_hop", "test", 4, "q", ("x",), ("Portugal Tagus", "Danube"), (4, 0)
    )
    assert retrievable([hits_lisbon, misses, two_hop_miss], dense, k=1) == [True, False, False]


def test_env_tasks_pass_the_check_and_a_size_cap_keeps_every_kind():
    retriever = shared_retriever("bm25", vital_articles_corpus())
    tasks = search_tasks("test", retriever=retriever, top_k=3)
    ids = {t.id for t in tasks}
    candidates = {c.id: c for c in _candidates()}
    kept = [candidates[i] for i in ids]
    assert all(c.split == "test" for c in kept)
    assert retrievable(kept, retriever, 3) == [True] * len(kept)
    capped = search_tasks("test", retriever=retriever, top_k=3, size=30)
    assert {t.metadata["kind"] for t in capped} == {t.metadata["kind"] for t in tasks}
    assert len({t.metadata["kind"] for t in tasks}) >= 4
    assert search_tasks("test", retriever=retriever, top_k=3) is tasks  # one list per process


def test_task_metadata_never_holds_the_gold():
    retriever = shared_retriever("bm25", vital_articles_corpus())
    for task in search_tasks("test", retriever=retriever, top_k=3):
        assert not any(_has(str(v), g) for v in task.metadata.values() for g in task.gold)


def test_no_train_task_touches_an_article_of_a_held_out_task():
    # Every hop counts: a train question about a two-hop task's bridge person
    # would show the held-out answer.
    articles = {"train": set(), "test": set()}
    for c in _candidates():
        articles[c.split].update(c.gold_passages)
    assert not articles["train"] & articles["test"]
    assert sum(c.kind.startswith("two_hop") and c.split == "test" for c in _candidates()) >= 20


def _people(*records):
    from vt_envs.domains.search.bridges import Bridges
    from vt_envs.domains.search.corpus import Corpus, Passage

    return Bridges(Corpus([Passage(str(i), t, x) for i, (t, x) in enumerate(records)], name="p"))


def test_a_person_is_mentioned_only_as_a_name_standing_alone():
    people = _people(
        ("Muhammad Ali", "Muhammad Ali was an American boxer. He won."),
        ("Marie Curie", "Marie Curie was a Polish physicist. She won."),
        ("Stanley Kubrick", "Stanley Kubrick was an American filmmaker. He directed."),
    )
    assert people.mentions("Muhammad Ali Jinnah was a barrister.") == []
    assert people.mentions("The Université Pierre et Marie Curie is in Paris.") == []
    assert people.mentions("He visited Lake Muhammad Ali twice.") == []
    assert people.mentions("The Muhammad Ali Prize is awarded yearly.") == []
    assert people.mentions("It was directed by Stanley Kubrick.") == ["Stanley Kubrick"]
    assert people.mentions("Sir Stanley Kubrick, the director, said so.") == ["Stanley Kubrick"]


def test_year_blanks_are_years_and_eras_are_accepted():
    from vt_envs.domains.search.candidates import year_cloze as _year_cloze
    from vt_envs.domains.search.corpus import Passage

    quantity = Passage("x", "Beetles", "There are over 1100 species of beetle in the region today.")
    assert _year_cloze(0, quantity) is None
    bc = Passage(
        "y", "Stonehenge", "Its stones were raised around 1500 BC by the people of the plain."
    )
    assert _year_cloze(0, bc).golds == ("1500 BC", "1500")


def test_masked_subjects_blank_inflections_and_drop_openings_naming_part_of_the_title():
    from vt_envs.domains.search.candidates import masked_subject as _masked_subject
    from vt_envs.domains.search.corpus import Passage

    algebra = Passage(
        "a", "Algebra", "Algebra is the study of algebraic structures and the rules of symbols."
    )
    task = _masked_subject(0, algebra)
    assert "algebraic" not in task.question.lower()
    short = Passage(
        "s",
        "Biological sex",
        "Sex is the trait that determines whether an organism produces male or female gametes.",
    )
    # The passage names its subject "Sex", a part of the title that is not a gold
    # (partial spans never are): the answer it suggests would score 0, so no task.
    assert _masked_subject(0, short) is None


def test_task_ids_are_opaque():
    import re

    for c in _candidates()[:500]:
        assert re.fullmatch(r"search/(train|test)/[a-z_]+/[0-9a-f]{12}", c.id), c.id
    assert len({c.id for c in _candidates()}) == len(_candidates())
