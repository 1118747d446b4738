"""Fixtures of the search tests: a small corpus and a cheap lexical embedder.

The real corpus and all-MiniLM-L6-v2 are exercised through ``gym.make`` in
test_search_env.py; these serve the unit tests of caching, indexes and
batching, which need an embedder that costs nothing and retrieves sensibly.
"""

from __future__ import annotations

import pytest
from search_helpers import HashingEmbedder

from vt_envs.domains.search.corpus import Corpus, Passage

CITIES = {
    "Paris": "Paris is the capital and largest city of France, on the river Seine.",
    "Berlin": "Berlin is the capital of Germany and its most populous city.",
    "Madrid": "Madrid is the capital of Spain, in the centre of the Iberian Peninsula.",
    "Rome": "Rome is the capital of Italy, founded according to legend by Romulus.",
    "Lisbon": "Lisbon is the capital of Portugal, on the Atlantic coast at the Tagus.",
    "Vienna": "Vienna is the capital of Austria, on the river Danube.",
}


@pytest.fixture
def small_corpus() -> Corpus:
    return Corpus(
        [Passage(f"c{i}", title, text) for i, (title, text) in enumerate(CITIES.items())],
        name="cities",
    )


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder()
