"""Summaries that need no model, each within the extractive budget unless it is a ceiling.

- ``lead_k``: the first `budget` sentences (the news-summary baseline);
- ``random_k``: `budget` sentences drawn at random (seeded per document);
- ``tfidf_centrality``: the `budget` sentences closest (TF-IDF cosine) to the whole document;
- ``oracle``: the sentences that answer the document's questions (knows the questions: the
  ceiling within the budget);
- ``full_document``: the document itself, over budget (the reader's ceiling, Summary-RL's
  ``percent_full``).

Each returns the kept 0-based sentence numbers, in document order. Beside them,
:func:`position_only` is a number, not a summary: the expected share of a summarizer that sees
positions but not words (the report prints it with the baselines, so a run that learned only
positions reads as such).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from math import comb

import numpy as np

from grail.tasks.summarize.reader import binds


def lead_k(document: dict, budget: int) -> list[int]:
    """The first `budget` sentences.

    >>> lead_k({"sentences": ["a", "b", "c"]}, 2)
    [0, 1]
    """
    return list(range(min(budget, len(document["sentences"]))))


def random_k(document: dict, budget: int, seed: int = 0) -> list[int]:
    """The same draw for the same document and seed, on every machine."""
    n = len(document["sentences"])
    rng = np.random.default_rng([seed, zlib.crc32(document["document_id"].encode())])
    return sorted(int(k) for k in rng.choice(n, min(budget, n), replace=False))


def tfidf_centrality(document: dict, budget: int) -> list[int]:
    """The sentences whose TF-IDF vectors are closest to the document's mean vector.

    >>> doc = {"sentences": ["Ostern makes rope.", "Ostern has rope mills.", "Rain fell."]}
    >>> tfidf_centrality(doc, 2)
    [0, 1]
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    sentences = document["sentences"]
    if len(sentences) <= budget:
        return list(range(len(sentences)))
    matrix = TfidfVectorizer(sublinear_tf=True).fit_transform(sentences)
    centre = np.asarray(matrix.mean(axis=0)).ravel()
    scores = matrix @ centre
    return sorted(int(k) for k in np.argsort(-scores, kind="stable")[:budget])


def oracle(document: dict, budget: int) -> list[int]:
    """The first sentence binding each answerable question's answer, up to `budget`."""
    kept: list[int] = []
    for question in document["questions"]:
        if not question["answer_aliases"]:
            continue
        found = next((k for k, s in enumerate(document["sentences"]) if binds(s, question)), None)
        if found is not None and found not in kept and len(kept) < budget:
            kept.append(found)
    return sorted(kept)


def full_document(document: dict, budget: int) -> list[int]:
    return list(range(len(document["sentences"])))


def position_only(document: dict, budget: int) -> float | None:
    """The expected share answered by sentence 1 and `budget` - 1 other sentences drawn at
    random: the position-only ceiling of the synthetic study, whose generator puts the subject
    in sentence 1 and shuffles the rest (every later position is alike, so no choice by
    position does better in expectation). None without the deterministic reader's fields.

    >>> doc = {"sentences": ["Ostern has 12 bridges.", "Rain fell.", "Ostern employs 40 people."],
    ...        "questions": [{"entity_aliases": ["Ostern"], "cues": ["bridge"],
    ...                       "answer_aliases": ["12"]},
    ...                      {"entity_aliases": ["Ostern"], "cues": ["employ"],
    ...                       "answer_aliases": ["40"]}]}
    >>> position_only(doc, 2)  # the bridges always; the staff half the time
    0.75
    """
    questions, sentences = document["questions"], document["sentences"]
    if not all(q["entity_aliases"] for q in questions):
        return None
    others, draws = len(sentences) - 1, max(0, min(budget, len(sentences)) - 1)

    def none_kept(binding: int) -> float:  # no sentence of `binding` (after the first) drawn
        return comb(others - binding, draws) / comb(others, draws)

    shares = []
    for q in questions:
        given = bool(q["answer_aliases"])  # answerable: a sentence binding the answer answers
        first = binds(sentences[0], q, answer=given)
        binding = sum(binds(s, q, answer=given) for s in sentences[1:])
        kept = 1.0 if first else 1.0 - none_kept(binding)
        shares.append(kept if given else 1.0 - kept)  # unanswerable: right unless one binds
    return sum(shares) / len(shares)


BASELINES: dict[str, Callable[[dict, int], list[int]]] = {
    "lead_k": lead_k,
    "random_k": random_k,
    "tfidf_centrality": tfidf_centrality,
    "oracle": oracle,
    "full_document": full_document,
}
CEILINGS = ("oracle", "full_document")


def baseline_summary(name: str, document: dict, mode: str, budget: int) -> str | None:
    """What the reader sees of a baseline: its sentences within the budget; in the abstractive
    mode (a budget in characters) the most sentences of its choice whose text fits. The full
    document is never cut (the reader's ceiling); the oracle needs the deterministic reader's
    fields (None without them).

    >>> doc = {"sentences": ["Ostern makes rope.", "It rains.", "Ostern has mills."]}
    >>> baseline_summary("lead_k", doc, "abstractive", 30)
    'Ostern makes rope. It rains.'
    """
    pick, sentences = BASELINES[name], document["sentences"]
    if name == "oracle" and not all(q["entity_aliases"] for q in document["questions"]):
        return None
    if mode == "extractive" or name == "full_document":
        return " ".join(sentences[k] for k in pick(document, budget))
    text = ""
    for k in range(1, len(sentences) + 1):
        longer = " ".join(sentences[i] for i in pick(document, k))
        if len(longer) > budget:
            break
        text = longer
    return text
