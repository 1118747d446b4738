"""One-hop task candidates of VT-Search-v0 and the text helpers every kind shares.

- ``masked_subject``: a passage's opening with every word of its subject's
  names blanked; the answer is the subject.
- ``year_cloze``: a named article's sentence holding one year, with the year
  blanked; the answer is the year.

**Golds are the title and true aliases only** (:func:`aliases`): the title;
the title without its parenthetical qualifier ("Mercury (planet)" ->
"Mercury"); the name the opening sentence gives its subject when it is a run
of the title's words or contains them all ("Sex is ..." for "Biological
sex", "Christian Johann Heinrich Heine was ..." for "Heinrich Heine");
the alternative names the opening states ("X, also known as Y or Z, ...",
"X or Y is ...", "X (ABC) is ..."); and for a person, the one name word the
summary itself uses alone ("Einstein", "Mao"). A person is an article whose
summary has a sentence beginning with "He" or "She" and whose title is two to
four capitalized words with no "of", digit or regnal number. A word of the
title alone ("Revolution" for "1911 Revolution", "Portugal" for "Afonso I
of Portugal") is never a gold unless the opening names the subject so.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vt_envs.domains.search.corpus import Passage
from vt_envs.domains.search.verifier import normalize_answer

__all__ = ["BLANK", "YEAR_BLANK", "Candidate", "aliases", "is_person", "split_of"]

HELD_OUT_ONE_IN = 10
BLANK = "___"
YEAR_BLANK = "____"
MAX_WORDS = 60


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _words(
    "a an the of and or in on at to for by with from as is was de la le du von van "
    "der al el i ii iii iv"
)
_YEAR_CONTEXT = _words(
    "in since by from until till to of c c. circa ca. around about between before after "
    "during early late mid and or year years the its"
)
_ERAS = frozenset({"BC", "BCE", "AD", "CE"})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
YEAR = re.compile(r"(?<![\d$£€.,])\b(1[0-9]{3}|20[0-2][0-9])\b(?![\d,.]\d)")
# "X, also known as Y or Z, is ...": the alternative names, before the main verb.
_KNOWN_AS = re.compile(
    r"\b(?:also|commonly|more commonly|often|sometimes|formerly|officially|simply|otherwise|"
    r"usually|popularly|and globally)(?: and \w+)? (?:known|called|referred to) as "
    r"(?:simply )?([^,;.()]+)"
)
_MAIN_VERB = re.compile(r" (?:is|was|are|were|has|had) ")
# The opening's subject: "The X is", "X (ABC) was", "X, ..., is", "X or Y are".
_LEAD = re.compile(r"^(?:The |An? )?(.+?)(?: \((?P<paren>[^()]*)\))?(?: is | was | are | were |, )")
_HE_SHE = re.compile(r"(?:^|[.!?]\s+)(?:He|She) ")
_REGNAL = re.compile(r"^(?:[IVXL]+|Jr\.?|Sr\.?)$")


@dataclass(frozen=True)
class Candidate:
    """A generated task before the retrieval and closed-book checks.

    Attributes:
        kind: one of :data:`~vt_envs.domains.search.tasks.TASK_KINDS`.
        split: ``"train"`` or ``"test"``.
        passage: the corpus position of the article the task is about (hop 1).
        question: the prompt.
        golds: accepted answers (the first is canonical).
        queries: the oracle's query for each hop.
        gold_passages: the corpus position each hop's query must retrieve.
    """

    kind: str
    split: str
    passage: int
    question: str
    golds: tuple[str, ...]
    queries: tuple[str, ...]
    gold_passages: tuple[int, ...]

    key: str = ""

    @property
    def id(self) -> str:
        """Opaque and stable: a hash of the kind and the hop articles' titles (never
        their corpus positions, which would point an agent at the answer)."""
        return f"search/{self.split}/{self.kind}/{self.key}"


def split_of(title: str) -> str:
    """``"test"`` for about one title in :data:`HELD_OUT_ONE_IN`, else ``"train"`` (stable)."""
    digest = hashlib.sha256(f"vt-search-split:{title}".encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % HELD_OUT_ONE_IN == 0 else "train"


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def base_title(title: str) -> str:
    """``"Jaws (film)"`` → ``"Jaws"``."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip() or title


def name_words(name: str) -> list[str]:
    words = re.findall(r"[\w'’-]+", base_title(name))
    content = [w for w in words if w.lower() not in STOPWORDS and len(w) > 1]
    return content or words


def mask_words(
    text: str, words: Iterable[str], blank: str = BLANK, *, inflections: bool = False
) -> str:
    """Blank every occurrence of ``words`` (and their possessives; with
    ``inflections``, also longer words they start, e.g. "algebra" → "algebraic")."""
    for word in sorted(set(words), key=len, reverse=True):
        tail = r"\w*" if inflections and len(word) >= 4 else ""
        pattern = rf"(?<![\w]){re.escape(word)}{tail}(?:'s|’s)?(?![\w])"
        text = re.sub(pattern, blank, text, flags=re.I)
    # "___ ___" (a full name) reads as one blank.
    return re.sub(rf"{re.escape(blank)}(?:[\s,.-]+{re.escape(blank)})+", blank, text)


def still_names(text: str, words: Iterable[str]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text, re.I) for w in words)


def cap_words(text: str, limit: int = MAX_WORDS) -> str:
    words = text.split()
    return text if len(words) <= limit else " ".join(words[:limit]) + " …"


def has_phrase(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` on word boundaries, after normalization."""
    norm = normalize_answer(phrase)
    return bool(norm) and f" {norm} " in f" {normalize_answer(text)} "


def leaks(question: str, golds: Sequence[str]) -> bool:
    return any(has_phrase(question, g) for g in golds)


def is_person(p: Passage) -> bool:
    """A person's article: a sentence begins with "He" or "She", and the title is two
    to four capitalized words without "of", a digit or a regnal number."""
    words = base_title(p.title).split()
    if not 2 <= len(words) <= 4 or not _HE_SHE.search(p.text):
        return False
    particles = {"de", "da", "del", "di", "van", "von", "der", "bin", "ibn", "al-", "y"}
    return (
        all(w[:1].isupper() or w in particles for w in words)
        and "of" not in words
        and not any(ch.isdigit() for ch in p.title)
        and not _REGNAL.match(words[-1])
    )


_NOT_NAMES = _words("by his her its their name names term just simply")


def _alias(text: str, limit: int = 6) -> str | None:
    """A stated name, cleaned: no leading article or quotes, at most ``limit`` words."""
    name = re.sub(r"^(?:the|a|an)\s+", "", text.strip(" \"'“”"), flags=re.I).strip(" \"'“”")
    words = name.split()
    if not words or len(words) > limit or any(ch.isdigit() for ch in name):
        return None
    if words[0].lower() in _NOT_NAMES or re.search(r" and | also |[–—]| known ", name):
        return None  # "by the misleading name X", "Dipanegara and Dipa Negara"
    return name


def _holds_title(name: str, title: str) -> bool:
    """Whether ``name`` is ``title`` or holds it whole ("Sir Peter Paul Rubens")."""
    a, b = normalize_answer(name), normalize_answer(title)
    return bool(a) and bool(b) and f" {b} " in f" {a} "


def opening_lead(opening: str) -> str | None:
    """The name the opening sentence starts with ("The X is ..." -> "X")."""
    lead = _LEAD.match(opening)
    return re.split(r",? or ", lead.group(1))[0].strip() if lead else None


def _part_of(name: str, title: str) -> bool:
    """Whether ``name`` is a run of ``title``'s words, shorter than the title."""
    a, b = normalize_answer(name), normalize_answer(base_title(title))
    return bool(a) and a != b and f" {a} " in f" {b} "


def _opening_names(opening: str, title: str) -> list[str]:
    """The names the opening sentence gives its subject (see the module docstring)."""
    names: list[str] = []
    lead = _LEAD.match(opening)
    if lead:
        parts = [_alias(x, 8) for x in re.split(r",? or ", lead.group(1))]
        if parts and parts[0] and _holds_title(parts[0], title):
            names += [x for x in parts if x]  # "Sufism or Sufi Islam is ..."
            paren = lead.group("paren")
            if paren and re.fullmatch(r"[A-Z][\w.&'’ -]{1,40}", paren) and ":" not in paren:
                names += [x for x in [_alias(paren)] if x]  # "... Countries (OAPEC) ..."
    verb = _MAIN_VERB.search(opening)
    for match in _KNOWN_AS.finditer(opening):
        if verb is not None and match.start() > verb.start():
            break  # "... is a process known as X": X is not the subject's name
        names += [x for x in map(_alias, re.split(r",? or |, ", match.group(1))) if x]
    return names


def _used_alone(p: Passage) -> str | None:
    """The one name word a person's summary uses alone ("Einstein"), if any."""
    words = base_title(p.title).split()
    rest = p.text[len(sentences(p.text)[0]) :] if sentences(p.text) else ""
    for word in (words[-1], words[0]):
        if len(word) > 2 and re.search(rf"(?<![\w-]){re.escape(word)}(?:'s|’s)?(?![\w-])", rest):
            others = [w for w in words if w != word]
            near = re.findall(rf"(?:\S+ )?{re.escape(word)}(?: \S+)?", rest)
            if any(not any(o in n for o in others) for n in near):
                return word
    return None


def aliases(p: Passage) -> tuple[str, ...]:
    """The accepted names of ``p``'s subject, the title first (see the module docstring)."""
    out = [p.title, base_title(p.title)]
    opening = (sentences(p.text) or [""])[0]
    out += _opening_names(opening, base_title(p.title))
    if is_person(p):
        out += [x for x in [_used_alone(p)] if x]
    seen: dict[str, str] = {}
    for name in out:
        seen.setdefault(normalize_answer(name), name)
    return tuple(name for norm, name in seen.items() if norm)


def masked_subject(i: int, p: Passage) -> Candidate | None:
    parts = sentences(p.text)
    if not parts:
        return None
    text = parts[0]
    if len(text.split()) < 12 and len(parts) > 1:
        text = f"{text} {parts[1]}"
    lead = opening_lead(text)
    if lead and lead != base_title(p.title) and _part_of(lead, p.title):
        return None  # "Sex is ..." of "Biological sex": the passage's name would score 0
    golds = aliases(p)
    words = [w for name in golds for w in name_words(name)]
    masked = cap_words(mask_words(text, words, inflections=True))
    if BLANK not in masked or len(masked.split()) < 8 or still_names(masked, words):
        return None
    question = (
        f"Which subject is this passage about? Its name is replaced by {BLANK}.\n"
        f'"{masked}"\nAnswer with the name of the subject.'
    )
    if leaks(question, golds):
        return None
    return Candidate("masked_subject", "", i, question, golds, (masked,), (i,))


def year_cloze(i: int, p: Passage) -> Candidate | None:
    for sentence in sentences(p.text):
        years = list(YEAR.finditer(sentence))
        if len(years) != 1 or not 6 <= len(sentence.split()) <= MAX_WORDS:
            continue
        match = years[0]
        year = match.group(1)
        before = sentence[: match.start()].split()[-1:] or [""]
        after = sentence[match.end() :].split()[:1] or [""]
        era = after[0].strip(".,;:)").upper()
        # A year, not a quantity ("over 1100 species", "2×1019 km"): a temporal word
        # before it, or an era after it.
        if before[0].lower().strip("(,") not in _YEAR_CONTEXT and era not in _ERAS:
            continue
        if year in p.title:
            continue
        masked = sentence[: match.start()] + YEAR_BLANK + sentence[match.end() :]
        golds = (f"{year} {era}", year) if era in _ERAS else (year,)
        question = (
            f'The Wikipedia summary of "{p.title}" has this sentence, with a year replaced by '
            f'{YEAR_BLANK}:\n"{masked}"\nWhich year is it? Answer with the year only.'
        )
        if leaks(question, golds):
            continue
        return Candidate("year_cloze", "", i, question, golds, (f"{p.title}: {masked}",), (i,))
    return None
