"""The deterministic reader: which hidden questions a summary answers.

A question counts as answered when one sentence of the summary binds the question's entity to
the answer: it names the entity (any of its names), uses one of the attribute's cue words, and
states the answer (any alias). Listing every number, or keeping a sentence about another entity,
answers nothing. A question the document cannot answer counts as answered when no sentence makes
that binding at all (the reader says the document does not say; a summary that invents one is
wrong), as RepLiQA's reader is asked to do.

This is the embedded default's reader: exact, free and the same on every machine. The real path
(RepLiQA) asks an OpenAI-compatible reader and judge (recipes name them).
"""

from __future__ import annotations

import re
from functools import lru_cache

# A sentence ends at . ! or ? followed by space and a capital, digit or quote; and at a newline.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9'\"(])|\s*\n+\s*")


def split_sentences(text: str) -> list[str]:
    """A document's or summary's sentences, in order.

    >>> split_sentences("Ostern makes rope. It has 4.2 million crowns.\\nRecords are lost.")
    ['Ostern makes rope.', 'It has 4.2 million crowns.', 'Records are lost.']
    """
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


@lru_cache(maxsize=4096)
def mention(alias: str) -> re.Pattern:
    """`alias` as a whole phrase, any case."""
    return re.compile(rf"(?<!\w){re.escape(alias)}(?!\w)", re.IGNORECASE)


def binds(sentence: str, question: dict, answer: bool = True) -> bool:
    """Whether `sentence` states the question's attribute of its entity (with the gold answer
    when `answer`, with any value otherwise).

    >>> q = {"entity_aliases": ["Varnol Works", "Varnol"], "cues": ["employ"],
    ...      "answer_aliases": ["1,204", "1204"]}
    >>> binds("Varnol employs 1,204 people.", q), binds("Brelin employs 1,204 people.", q)
    (True, False)
    >>> binds("Varnol: 1,204; 77; 1850.", q), binds("Varnol employs 900 people.", q)
    (False, False)
    """
    if not any(mention(name).search(sentence) for name in question["entity_aliases"]):
        return False
    if not any(re.search(cue, sentence, re.IGNORECASE) for cue in question["cues"]):
        return False
    return not answer or any(mention(a).search(sentence) for a in question["answer_aliases"])


def answered(summary: str, question: dict) -> bool:
    """Whether a reader of `summary` alone answers `question` right.

    >>> q = {"entity_aliases": ["Ostern"], "cues": ["mayor"], "answer_aliases": []}
    >>> answered("Ostern has 12 bridges.", q), answered("The mayor of Ostern is Ilse Kel.", q)
    (True, False)
    """
    sentences = split_sentences(summary)
    if not question["answer_aliases"]:  # the document does not say
        return not any(binds(s, question, answer=False) for s in sentences)
    return any(binds(s, question) for s in sentences)


def questions_answered(summary: str, questions: list[dict]) -> list[bool]:
    """One verdict per question."""
    return [answered(summary, q) for q in questions]
