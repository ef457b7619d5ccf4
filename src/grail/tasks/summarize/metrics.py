"""How well a system's summaries let a reader answer the hidden questions, per document and in
all, with document-bootstrap intervals (documents, not questions, are resampled: a document's
five questions share one summary).

Per document: the share of its questions answered (Summary-RL's reward, over 5), the share of
its answerable ones, words, compression (summary characters over document characters) and
faithfulness violations (numbers and capitalised names in the summary that the document never
uses: zero for extractive summaries by construction).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from grail.core.bootstrap import paired_difference, participant_bootstrap
from grail.tasks.summarize.reader import questions_answered

# A number (1,204 or 4.2) or a capitalised word not at a sentence start
CHECKED = re.compile(r"\d[\d,.]*\d|\d|(?<=[a-z,;] )[A-Z][a-z]+")


def unsupported(summary: str, document: str) -> list[str]:
    """Numbers and names in `summary` that never occur in `document` (a cheap faithfulness check).

    >>> unsupported("Ostern has 12 bridges and Varnol 40.", "Ostern has 12 bridges.")
    ['Varnol', '40']
    """
    return [m.group(0) for m in CHECKED.finditer(summary) if m.group(0) not in document]


def score_document(summary: str | None, document: dict, verdicts: list | None = None) -> dict:
    """One document's scores; a reply with no summary in the format answers nothing.

    `verdicts`: a model reader's, one per question (None: missing, left out of the share);
    by default the deterministic reader's. A document with every verdict missing has no share.
    """
    questions = document["questions"]
    if verdicts is None:
        verdicts = (
            questions_answered(summary, questions)
            if summary is not None
            else [False] * len(questions)
        )
    read = [v for v in verdicts if v is not None]
    answerable = [
        v for v, q in zip(verdicts, questions, strict=True) if q["answerable"] and v is not None
    ]
    return {
        "answered": sum(read) / len(read) if read else None,
        "answerable_answered": sum(answerable) / len(answerable) if answerable else None,
        "missing": len(verdicts) - len(read),
        "parsed": summary is not None,
        "words": len((summary or "").split()),
        "compression": len(summary or "") / max(1, len(document["text"])),
        "unsupported": len(unsupported(summary or "", document["text"])),
    }


def mean_with_interval(
    values: Sequence[float], documents: Sequence[str], replicates: int = 1000
) -> dict:
    """Mean and 95% document-bootstrap interval (`replicates`) of per-document `values`."""
    array = np.asarray(values, dtype=float)
    low, high = participant_bootstrap(lambda rows: array[rows].mean(), documents, replicates)
    return {"mean": float(array.mean()), "ci": [low, high]}


def _present(values: Sequence, documents: Sequence[str]) -> tuple[list, list]:
    kept = [(v, d) for v, d in zip(values, documents, strict=True) if v is not None]
    return [v for v, _ in kept], [d for _, d in kept]


def summarize_scores(scores: list[dict], documents: Sequence[str], replicates: int = 1000) -> dict:
    """A system's totals over the documents it was scored on; verdicts a model reader or judge
    could not give are counted (``missing_verdicts``) and left out of the shares."""
    answered = _present([s["answered"] for s in scores], documents)
    answerable = _present([s["answerable_answered"] for s in scores], documents)
    return {
        "answered": mean_with_interval(*answered, replicates) if answered[0] else None,
        "answerable_answered": (
            mean_with_interval(*answerable, replicates) if answerable[0] else None
        ),
        "parse_rate": float(np.mean([s["parsed"] for s in scores])),
        "words": float(np.mean([s["words"] for s in scores])),
        "compression": float(np.mean([s["compression"] for s in scores])),
        "unsupported_per_summary": float(np.mean([s["unsupported"] for s in scores])),
        "documents": len(scores),
        "missing_verdicts": int(sum(s.get("missing", 0) for s in scores)),
    }


def _pairs(first: list[dict], second: list[dict], documents: Sequence[str]):
    """The documents both systems have a share for."""
    return [
        (a["answered"], b["answered"], d)
        for a, b, d in zip(first, second, documents, strict=True)
        if a["answered"] is not None and b["answered"] is not None
    ]


def win_rate(
    first: list[dict], second: list[dict], documents: Sequence[str], replicates: int = 1000
) -> dict:
    """How often `first`'s summary answers more of a document's questions than `second`'s
    (1 a win, 0.5 a tie, 0 a loss), with a document-bootstrap interval."""
    pairs = _pairs(first, second, documents)
    points = [1.0 if a > b else 0.5 if a == b else 0.0 for a, b, _ in pairs]
    return mean_with_interval(points, [d for *_, d in pairs], replicates)


def paired_answered(
    first: list[dict], second: list[dict], documents: Sequence[str], replicates: int = 1000
) -> dict:
    """The mean per-document difference in questions answered, first minus second."""
    pairs = _pairs(first, second, documents)
    return paired_difference(
        [a for a, _, _ in pairs], [b for _, b, _ in pairs], [d for *_, d in pairs], replicates
    )
