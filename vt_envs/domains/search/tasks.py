"""Retrieval QA tasks generated from a corpus, with known answers and a fixed held-out split.

Three kinds, each answerable only from the corpus:

- ``masked_subject`` (one hop): a passage's opening sentence with every word
  of its subject's name blanked out; the answer is the subject (the title).
- ``year_cloze`` (one hop): a named article's sentence holding one year,
  with the year blanked out; the answer is the year.
- ``two_hop``: a sentence of article A that names a person B (one task per
  person A names), with B's name blanked out; the answer is B's nationality,
  which only B's own summary states (it is not in A's passage), so the agent
  must first find A to learn who B is, then search for B.

A candidate is kept only if (a) the answer does not appear in the question
and (b) each hop's *oracle query* (the blanked sentence for a hop whose
passage must be identified, the person's name for the second hop) retrieves
that hop's passage in the top ``k`` with the retriever the env uses. (a) is
checked at generation; (b) needs the retriever, so the kept ids are cached
per (corpus, retriever, k, generator version).

The split is a property of the article (a hash of its title): about one
article in ten is held out, for every kind, so no held-out article's text is
the subject of a training question.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vt_envs.core.task import Task, TaskList
from vt_envs.domains.search.corpus import Corpus, Passage
from vt_envs.domains.search.index import (
    cache_dir,
    cache_key,
    manifest_of,
    publish,
    unsealed,
)
from vt_envs.domains.search.retriever import Retriever
from vt_envs.domains.search.verifier import normalize_answer
from vt_envs.errors import InvalidConfigError

__all__ = [
    "GENERATOR_VERSION",
    "TASK_KINDS",
    "Candidate",
    "candidate_tasks",
    "search_tasks",
    "split_of",
]

logger = logging.getLogger(__name__)

TASK_KINDS = ("masked_subject", "year_cloze", "two_hop")
#: Bumped whenever generation changes, so cached filters are rebuilt.
GENERATOR_VERSION = 4
HELD_OUT_ONE_IN = 10
BLANK = "___"
YEAR_BLANK = "____"
_MAX_WORDS = 60


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_STOPWORDS = _words(
    "a an the of and or in on at to for by with from as is was de la le du von van "
    "der al el i ii iii iv"
)
_YEAR_CONTEXT = _words(
    "in since by from until till to of c c. circa ca. around about between before after "
    "during early late mid and or year years the its"
)
_ERAS = frozenset({"BC", "BCE", "AD", "CE"})
_HONORIFICS = _words("Sir Dame President King Queen Emperor Pope Saint St Dr General Prince")
_NAME_CONNECTORS = _words("de da del di du et van von der la le of y and")
_NOT_PEOPLE = _words(
    "City Company Prize Award University College Institute School Lake River Mountain "
    "Street Square Park Bridge Airport Stadium Museum Foundation Center Centre Dynasty "
    "Jr Jr. Sr Sr. Building Tower Hall Station Memorial"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_YEAR = re.compile(r"(?<![\d$£€.,])\b(1[0-9]{3}|20[0-2][0-9])\b(?![\d,.]\d)")
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


@dataclass(frozen=True)
class Candidate:
    """A generated task before the retrieval check.

    Attributes:
        kind: one of :data:`TASK_KINDS`.
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


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _base_title(title: str) -> str:
    """``"Jaws (film)"`` → ``"Jaws"``."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip() or title


def _name_words(title: str) -> list[str]:
    words = re.findall(r"[\w'’-]+", _base_title(title))
    content = [w for w in words if w.lower() not in _STOPWORDS and len(w) > 1]
    return content or words


def _mask_words(
    text: str, words: Iterable[str], blank: str = BLANK, *, inflections: bool = False
) -> tuple[str, list[str]]:
    """Blank every occurrence of ``words`` (and their possessives; with
    ``inflections``, also longer words they start, e.g. "algebra" → "algebraic").

    Returns the masked text and the original spans that were blanked.
    """
    replaced: list[str] = []

    def blank_out(match: re.Match) -> str:
        replaced.append(match.group(0))
        return blank

    for word in sorted(set(words), key=len, reverse=True):
        tail = r"\w*" if inflections and len(word) >= 4 else ""
        pattern = rf"(?<![\w]){re.escape(word)}{tail}(?:'s|’s)?(?![\w])"
        text = re.sub(pattern, blank_out, text, flags=re.I)
    # "___ ___" (a full name) reads as one blank.
    return re.sub(rf"{re.escape(blank)}(?:[\s,.-]+{re.escape(blank)})+", blank, text), replaced


def _still_names(text: str, words: Iterable[str]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text, re.I) for w in words)


def _cap_words(text: str, limit: int = _MAX_WORDS) -> str:
    words = text.split()
    return text if len(words) <= limit else " ".join(words[:limit]) + " …"


def _leaks(question: str, golds: Sequence[str]) -> bool:
    norm_q = f" {normalize_answer(question)} "
    return any(f" {normalize_answer(g)} " in norm_q for g in golds if normalize_answer(g))


def _masked_subject(i: int, p: Passage) -> Candidate | None:
    sentences = _sentences(p.text)
    if not sentences:
        return None
    text = sentences[0]
    if len(text.split()) < 12 and len(sentences) > 1:
        text = f"{text} {sentences[1]}"
    words = _name_words(p.title)
    masked, replaced = _mask_words(text, words, inflections=True)
    masked = _cap_words(masked)
    if BLANK not in masked or len(masked.split()) < 8 or _still_names(masked, words):
        return None
    # The passage may name its subject more briefly than the title ("Sex" for
    # "Biological sex"): the first blanked span counts too.
    spans = [s for s in replaced if len(s) >= 3 and s.lower() not in _STOPWORDS]
    golds = tuple(dict.fromkeys([p.title, _base_title(p.title), *spans[:1]]))
    question = (
        f"Which subject is this passage about? Its name is replaced by {BLANK}.\n"
        f'"{masked}"\nAnswer with the name of the subject.'
    )
    if _leaks(question, golds):
        return None
    return Candidate("masked_subject", "", i, question, golds, (masked,), (i,))


def _year_cloze(i: int, p: Passage) -> Candidate | None:
    for sentence in _sentences(p.text):
        years = list(_YEAR.finditer(sentence))
        if len(years) != 1 or not 6 <= len(sentence.split()) <= _MAX_WORDS:
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
        if _leaks(question, golds):
            continue
        return Candidate("year_cloze", "", i, question, golds, (f"{p.title}: {masked}",), (i,))
    return None


def _nationality(p: Passage) -> str | None:
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


class _People:
    """Titles of person articles (and their nationality) and an n-gram lookup of mentions."""

    def __init__(self, corpus: Corpus):
        self.nationality: dict[str, tuple[int, str]] = {}
        for j, p in enumerate(corpus):
            demonym = _nationality(p)
            if demonym and len(_base_title(p.title).split()) >= 2:  # one-word names are ambiguous
                self.nationality.setdefault(_base_title(p.title), (j, demonym))
        self.longest = max((len(t.split()) for t in self.nationality), default=0)

    def mentions(self, sentence: str) -> list[str]:
        """Person names standing alone in ``sentence``: not part of a longer proper
        noun ("Muhammad Ali Jinnah", "Ho Chi Minh City", "Marie Curie" in
        "Université Pierre et Marie Curie")."""
        words = sentence.replace(",", " , ").replace(";", " ; ").split()
        found = []
        for start in range(len(words)):
            for n in range(min(self.longest, len(words) - start), 1, -1):
                name = " ".join(words[start : start + n]).rstrip(".")
                if name in self.nationality and _stands_alone(words, start, start + n):
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


def _two_hop(i: int, p: Passage, people: _People) -> list[Candidate]:
    """One task per person named in A's passage (the first sentence naming them)."""
    norm_text = f" {normalize_answer(p.text)} "
    out: list[Candidate] = []
    asked: set[str] = set()
    for sentence in _sentences(p.text):
        if not 6 <= len(sentence.split()) <= _MAX_WORDS:
            continue
        for name in dict.fromkeys(people.mentions(sentence)):
            j, demonym = people.nationality[name]
            if name in asked or name == _base_title(p.title):
                continue
            if f" {normalize_answer(demonym)} " in norm_text:
                continue  # A's own passage would answer it: not two hops
            # Only the person's own name (and surname alone), not words it shares
            # with other names in the sentence ("Friedrich" Nietzsche).
            masked, _ = _mask_words(sentence, [name, name.split()[-1]])
            if _still_names(masked, [name]) or BLANK not in masked:
                continue
            question = (
                f'The Wikipedia summary of "{p.title}" mentions a person in this sentence, with '
                f'their name replaced by {BLANK}:\n"{masked}"\nWhat nationality is that person, '
                "according to their own Wikipedia summary? Answer with the nationality adjective "
                '(for example "French").'
            )
            if _leaks(question, (demonym,)):
                continue
            asked.add(name)
            out.append(
                Candidate(
                    "two_hop",
                    "",
                    i,
                    question,
                    (demonym,),
                    (f"{p.title}: {masked}", name),
                    (i, j),
                )
            )
    return out


def candidate_tasks(corpus: Corpus, kinds: Sequence[str] = TASK_KINDS) -> list[Candidate]:
    """Every generated task of ``kinds`` (both splits), before the retrieval check.

    Deterministic: a function of the corpus text only.
    """
    unknown = sorted(set(kinds) - set(TASK_KINDS))
    if unknown:
        raise InvalidConfigError(f"unknown task kind(s) {unknown}; known: {list(TASK_KINDS)}")
    people = _People(corpus) if "two_hop" in kinds else None
    out: list[Candidate] = []
    for kind in TASK_KINDS:
        if kind not in kinds:
            continue
        for i, passage in enumerate(corpus):
            if kind == "masked_subject":
                out.extend(filter(None, [_masked_subject(i, passage)]))
            elif kind == "year_cloze":
                out.extend(filter(None, [_year_cloze(i, passage)]))
            else:
                out.extend(_two_hop(i, passage, people))
    return _assign_splits(corpus, out)


def _assign_splits(corpus: Corpus, candidates: list[Candidate]) -> list[Candidate]:
    """Held-out articles: one title in ten by hash, plus every article A whose two-hop
    bridge person B is held out. A task is ``test`` if all its articles are held
    out, ``train`` if none is, and dropped otherwise, so no training question
    shows a held-out question's answer (a train question about B would)."""
    held_out = {i for i, p in enumerate(corpus) if split_of(p.title) == "test"}
    held_out |= {c.gold_passages[0] for c in candidates if c.gold_passages[-1] in held_out}
    out = []
    for c in candidates:
        inside = [j in held_out for j in c.gold_passages]
        if all(inside) or not any(inside):
            titles = "\x00".join(corpus[j].title for j in c.gold_passages)
            key = hashlib.sha256(f"{c.kind}\x00{titles}".encode()).hexdigest()[:12]
            split = "test" if all(inside) else "train"
            out.append(dataclasses.replace(c, split=split, key=key))
    return out


def retrievable(
    candidates: Sequence[Candidate], retriever: Retriever, k: int, *, batch: int = 256
) -> list[bool]:
    """Whether every hop's oracle query retrieves its gold passage in the top ``k``."""
    queries = [
        (c_i, q, gold)
        for c_i, c in enumerate(candidates)
        for q, gold in zip(c.queries, c.gold_passages)
    ]
    ok = [True] * len(candidates)
    for start in range(0, len(queries), batch):
        chunk = queries[start : start + batch]
        hits = retriever.search([q for _, q, _ in chunk], k)
        for (c_i, _, gold), row in zip(chunk, hits):
            if gold not in {h.index for h in row}:
                ok[c_i] = False
    return ok


def _kept_ids(
    candidates: Sequence[Candidate], retriever: Retriever, k: int, split: str
) -> set[str]:
    """Ids of ``split``'s candidates that pass the retrieval check (cached on disk)."""
    parts = (retriever.corpus.content_hash, retriever.name, split, f"k{k}", f"v{GENERATOR_VERSION}")
    path = cache_dir() / "tasks" / f"{cache_key(*parts)}.json"
    key = {"kept_ids": list(parts)}
    if path.is_file():
        reason = unsealed(manifest_of(path), [path], key)
        if reason is None:
            try:
                kept = json.loads(path.read_text())
                if isinstance(kept, list) and all(isinstance(i, str) for i in kept):
                    return set(kept)
                reason = "it is not a list of task ids"
            except (ValueError, TypeError) as exc:
                reason = f"it is unreadable ({exc})"
        logger.warning("the cached task ids %s cannot be used: %s; recomputing", path, reason)
        path.unlink(missing_ok=True)
    mine = [c for c in candidates if c.split == split]
    kept = [c.id for c, ok in zip(mine, retrievable(mine, retriever, k)) if ok]
    publish(path, lambda tmp: tmp.write_text(json.dumps(kept)), key, lambda tmp: None)
    return set(kept)


def to_task(candidate: Candidate, corpus: Corpus) -> Task:
    return Task(
        id=candidate.id,
        prompt=candidate.question,
        gold=list(candidate.golds),
        metadata={"kind": candidate.kind, "hops": len(candidate.queries), "source": corpus.name},
        # Privileged (like the gold): what the oracle searches for, and where the answer is.
        assets={
            "oracle_queries": list(candidate.queries),
            "gold_titles": [corpus[j].title for j in candidate.gold_passages],
        },
    )


def search_tasks(
    split: str,
    *,
    retriever: Retriever,
    top_k: int = 3,
    kinds: Sequence[str] = TASK_KINDS,
    size: int | None = None,
) -> TaskList:
    """The generated tasks of ``split`` over ``retriever.corpus`` that pass the retrieval check."""
    if split not in ("train", "test"):
        raise InvalidConfigError(f"split must be 'train' or 'test', got {split!r}")
    key = (retriever.corpus.content_hash, retriever.name, split, top_k, tuple(kinds), size)
    with _TASKS_LOCK:  # every env of a process shares one (immutable) task list
        tasks = _TASKS.get(key)
        if tasks is None:
            tasks = _TASKS[key] = _search_tasks(split, retriever, top_k, kinds, size)
    return tasks


_CANDIDATES: dict[str, list[Candidate]] = {}


def _all_candidates(corpus: Corpus) -> list[Candidate]:
    """:func:`candidate_tasks` of ``corpus``, generated once per process (both splits use it)."""
    found = _CANDIDATES.get(corpus.content_hash)
    if found is None:
        found = _CANDIDATES[corpus.content_hash] = candidate_tasks(corpus)
    return found


_TASKS: dict[tuple, TaskList] = {}
_TASKS_LOCK = threading.Lock()


def _search_tasks(
    split: str, retriever: Retriever, top_k: int, kinds: Sequence[str], size: int | None
) -> TaskList:
    everything = _all_candidates(retriever.corpus)
    kept = _kept_ids(everything, retriever, top_k, split)
    chosen = [c for c in everything if c.split == split and c.kind in kinds and c.id in kept]
    if size is not None:
        chosen = chosen[:size] if len(kinds) == 1 else _interleave(chosen, kinds)[:size]
    if not chosen:
        raise InvalidConfigError(
            f"no {split} tasks of kinds {list(kinds)} survive the retrieval check over "
            f"{retriever.corpus!r} with {retriever.name} at k={top_k}"
        )
    return TaskList([to_task(c, retriever.corpus) for c in chosen], name="search", split=split)


def _interleave(candidates: Sequence[Candidate], kinds: Sequence[str]) -> list[Candidate]:
    """Round-robin over kinds, so a size cap keeps every kind."""
    queues = [[c for c in candidates if c.kind == kind] for kind in kinds]
    longest = max(map(len, queues))
    return [q[i] for i in range(longest) for q in queues if i < len(q)]
