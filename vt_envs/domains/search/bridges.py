"""Multi-hop task candidates of VT-Search-v0: a sentence of article A names an
article B (blanked); the answer is a fact only B's own summary states.

- ``two_hop`` (a person -> their nationality): the demonym opening B's
  summary ("... was an American filmmaker").
- ``two_hop_capital`` (a capital city -> its country): "B is the capital
  (and largest city) of C".
- ``two_hop_founded`` (an organization or a city -> the year it was founded):
  a sentence of B that begins "Founded"/"Established", or says "B was
  founded/established", with one year in it.

So the agent must first find A to learn which B is meant, then search for B.
A candidate is dropped when A's own passage holds the answer (not two hops),
when the question holds it, and — for nationalities — when the question
states another nationality for B ("the Austrian statesman ___" asked of a
summary that calls him German): the question and the gold never disagree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from vt_envs.domains.search.candidates import (
    BLANK,
    MAX_WORDS,
    YEAR,
    Candidate,
    base_title,
    has_phrase,
    leaks,
    mask_words,
    sentences,
    still_names,
)
from vt_envs.domains.search.corpus import Corpus, Passage

__all__ = ["BRIDGE_KINDS", "Bridges", "bridge_tasks"]

BRIDGE_KINDS = ("two_hop", "two_hop_capital", "two_hop_founded")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_HONORIFICS = _words("Sir Dame President King Queen Emperor Pope Saint St Dr General Prince")
_NAME_CONNECTORS = _words("de da del di du et van von der la le of y and")
_NOT_PEOPLE = _words(
    "City Company Prize Award University College Institute School Lake River Mountain "
    "Street Square Park Bridge Airport Stadium Museum Foundation Center Centre Dynasty "
    "Jr Jr. Sr Sr. Building Tower Hall Station Memorial"
)
_PERSON = re.compile(r"\b(?:He|She|His|Her|he|she|his|her)\b")
# "was an American filmmaker": the demonym, then a lowercase word ("Danish-born
# Russian" is skipped: the word after "a" is not the nationality).
_DEMONYM_START = re.compile(r"^[^.;]*?\b(?:was|is) (?:a|an) (?:[a-z]+ )?([A-Z][a-z]+)(?= [a-z])")
_DEMONYM_SUFFIXES = ("an", "ese", "ish", "ic", "ch", "i")
_DEMONYM_EXTRA = frozenset({"Greek", "Soviet", "Swiss", "Thai", "Czech", "French", "Welsh"})
_NOT_DEMONYMS = _words(
    "Christian Catholic Muslim Buddhist Hindu Jewish Sunni Shia Protestant Anglican "
    "Lutheran Orthodox Islamic Republican Democratic Nobel Academy Olympic Roman "
    "Classical Baroque Romantic Renaissance Gothic Sufi Zen Marxist Stoic Platonic "
    "Hellenistic Vedic Biblical"
)
_CAPITAL_OF = re.compile(
    r"^[^.]*?\bis the capital(?: and (?:the )?(?:largest|most populous) city)? of "
    r"(?:the )?([A-Z][\w-]+(?: (?:and |of )?[A-Z][\w-]+)*)"
)


@dataclass(frozen=True)
class Bridge:
    """An article B other articles name, and the fact of it a ``kind`` task asks."""

    passage: int
    kind: str
    answer: str
    golds: tuple[str, ...]


def nationality(p: Passage) -> str | None:
    """The demonym opening a person's summary (``"... was an American filmmaker"``)."""
    if not _PERSON.search(p.text):
        return None
    match = _DEMONYM_START.match(p.text)
    if match is None:
        return None
    word = match.group(1)
    if word in _NOT_DEMONYMS:
        return None
    if word in _DEMONYM_EXTRA or word.endswith(_DEMONYM_SUFFIXES):
        return word
    return None


def capital_of(p: Passage) -> str | None:
    """The country a capital's summary opens by naming (``"... is the capital of Ghana"``)."""
    match = _CAPITAL_OF.match(p.text)
    return match.group(1) if match else None


def founded_year(p: Passage) -> str | None:
    """The year a summary says its subject was founded or established (one year, stated
    in a sentence that begins "Founded"/"Established" or says "<name>/It was founded")."""
    subject = re.escape(base_title(p.title))
    starts = re.compile(
        rf"^(?:(?:Founded|Established)\b|(?:It|The \w+|{subject}) (?:was|were) "
        r"(?:officially |formally |first )?(?:founded|established)\b)"
    )
    for sentence in sentences(p.text):
        if starts.match(sentence):
            years = YEAR.findall(sentence)
            return years[0] if len(set(years)) == 1 else None
    return None


class Bridges:
    """Every article B the multi-hop kinds can bridge to, and an n-gram lookup of
    their names standing alone in a sentence."""

    def __init__(self, corpus: Corpus, kinds: Sequence[str] = BRIDGE_KINDS):
        self.by_name: dict[str, Bridge] = {}
        for j, p in enumerate(corpus):
            name = base_title(p.title)
            demonym = nationality(p) if "two_hop" in kinds else None
            country = capital_of(p) if "two_hop_capital" in kinds else None
            year = founded_year(p) if "two_hop_founded" in kinds else None
            if demonym and len(name.split()) >= 2:  # one-word names of people are ambiguous
                self.by_name.setdefault(name, Bridge(j, "two_hop", demonym, (demonym,)))
            elif country:
                self.by_name.setdefault(name, Bridge(j, "two_hop_capital", country, (country,)))
            elif year:
                self.by_name.setdefault(name, Bridge(j, "two_hop_founded", year, (year,)))
        self.demonyms = (
            frozenset(b.answer for b in self.by_name.values() if b.kind == "two_hop")
            | _DEMONYM_EXTRA
        )
        self.longest = max((len(t.split()) for t in self.by_name), default=0)

    def mentions(self, sentence: str) -> list[str]:
        """Names standing alone in ``sentence``: not part of a longer proper noun
        ("Muhammad Ali Jinnah", "Ho Chi Minh City", "Marie Curie" in
        "Université Pierre et Marie Curie")."""
        words = sentence.replace(",", " , ").replace(";", " ; ").split()
        found = []
        for start in range(len(words)):
            for n in range(min(self.longest, len(words) - start), 0, -1):
                name = " ".join(words[start : start + n]).rstrip(".")
                if name in self.by_name and _stands_alone(words, start, start + n):
                    found.append(name)
                    break
        return found


def _capitalized(word: str) -> bool:
    return word[:1].isupper()


def _stands_alone(words: Sequence[str], start: int, end: int) -> bool:
    before = words[start - 1] if start > 0 else ""
    after = words[end] if end < len(words) else ""
    if _capitalized(before) and before.rstrip(".") not in _HONORIFICS:
        return False  # "Muhammad Ali" inside "... Lake Mobutu Sese Seko"
    if _capitalized(after) or after.rstrip(".,") in _NOT_PEOPLE:
        return False  # "Muhammad Ali Jinnah", "Ho Chi Minh City"
    # "Marie Curie" in "Université Pierre et Marie Curie"
    connected = before.lower() in _NAME_CONNECTORS and start > 1
    return not (connected and _capitalized(words[start - 2]))


_ASK = {
    "two_hop": (
        "a person",
        "their name",
        "What nationality is that person, according to their own Wikipedia summary? Answer "
        'with the nationality adjective (for example "French").',
    ),
    "two_hop_capital": (
        "a city",
        "its name",
        "That city is the capital of which country or region, according to the city's own "
        "Wikipedia summary? Answer with its name.",
    ),
    "two_hop_founded": (
        "an organization or place",
        "its name",
        "In which year was it founded (or established), according to its own Wikipedia "
        "summary? Answer with the year only.",
    ),
}


def _contradicts(masked: str, bridge: Bridge, bridges: Bridges) -> bool:
    """Whether the question states a nationality other than the gold (``"Austrian"``)."""
    if bridge.kind != "two_hop":
        return False
    stated = set(re.findall(r"[A-Z][a-z]+", masked)) & bridges.demonyms
    return bool(stated - {bridge.answer})


def bridge_tasks(i: int, p: Passage, bridges: Bridges) -> list[Candidate]:
    """One task per article B that A's passage names (the first sentence naming it)."""
    out: list[Candidate] = []
    asked: set[str] = set()
    for sentence in sentences(p.text):
        if not 6 <= len(sentence.split()) <= MAX_WORDS:
            continue
        for name in dict.fromkeys(bridges.mentions(sentence)):
            bridge = bridges.by_name[name]
            if name in asked or bridge.passage == i or name == base_title(p.title):
                continue
            if any(has_phrase(p.text, g) for g in bridge.golds):
                continue  # A's own passage would answer it: not two hops
            # Only B's own name (and a person's surname), not words it shares with
            # other names in the sentence ("Friedrich" Nietzsche).
            words = [name, name.split()[-1]] if bridge.kind == "two_hop" else [name]
            masked = mask_words(sentence, words)
            if still_names(masked, [name]) or BLANK not in masked:
                continue
            if _contradicts(masked, bridge, bridges):
                continue
            what, whose, ask = _ASK[bridge.kind]
            question = (
                f'The Wikipedia summary of "{p.title}" mentions {what} in this sentence, with '
                f'{whose} replaced by {BLANK}:\n"{masked}"\n{ask}'
            )
            if leaks(question, bridge.golds):
                continue
            asked.add(name)
            queries = (f"{p.title}: {masked}", name)
            out.append(
                Candidate(bridge.kind, "", i, question, bridge.golds, queries, (i, bridge.passage))
            )
    return out
