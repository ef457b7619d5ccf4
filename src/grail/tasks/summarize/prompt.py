"""The summarize task's prompt and answer format, in one place.

Two modes, each with its budget stated in the prompt (no hidden gate):

- ``extractive`` (the embedded default): the document's sentences are numbered; the model keeps
  at most `budget` of them by number, ``<keep>3, 7, 12</keep>``. Numbers past the budget, repeated
  or out of range are ignored, and the prompt says so. A tiny model can learn this on 2 cores.
- ``abstractive`` (the cluster default, as Summary-RL): the model writes the summary itself in
  ``<summary></summary>``, at most `budget` characters; only the first `budget` characters are
  read, and the prompt says so.

The questions are never shown.
"""

from __future__ import annotations

import re
from typing import Literal

Mode = Literal["extractive", "abstractive"]
MODES = ("extractive", "abstractive")
BUDGETS = {"extractive": 12, "abstractive": 1200}  # sentences; characters

SCORED_AS = "documents"  # the benchmark has a reader read each summary (grail.tasks.PARTS)

SYSTEM = {
    "extractive": (
        "You summarize documents for a reader who will answer questions you do not see. "
        "Keep the sentences that state the facts about the document's subject: reply with "
        "their numbers in <keep></keep>, at most {budget} of them (any further numbers are "
        "ignored), e.g. <keep>1, 4, 9</keep>."
    ),
    "abstractive": (
        "You summarize documents for a reader who will answer questions you do not see. "
        "Write a summary that conveys the facts about the document's subject in "
        "<summary></summary>, at most {budget} characters (the reader sees no more)."
    ),
}
KEEP = re.compile(r"<keep>(.*?)</keep>", re.DOTALL)
SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


def user_prompt(sentences: list[str], mode: Mode) -> str:
    """The document as the model sees it: numbered sentences (extractive) or running text.

    >>> print(user_prompt(["Ostern makes rope.", "Rain is common."], "extractive"))
    DOCUMENT
    [1] Ostern makes rope.
    [2] Rain is common.
    """
    if mode == "extractive":
        body = "\n".join(f"[{k}] {s}" for k, s in enumerate(sentences, start=1))
    else:
        body = " ".join(sentences)
    return f"DOCUMENT\n{body}"


def build_messages(sentences: list[str], mode: Mode = "extractive", budget: int | None = None):
    """The chat a model is asked (system and user turns)."""
    budget = budget or BUDGETS[mode]
    return [
        {"role": "system", "content": SYSTEM[mode].format(budget=budget)},
        {"role": "user", "content": user_prompt(sentences, mode)},
    ]


def kept_sentences(reply: str, n_sentences: int, budget: int) -> list[int] | None:
    """The 0-based sentences an extractive reply keeps, in document order; None without a
    ``<keep>`` tag. The first `budget` valid distinct numbers count.

    >>> kept_sentences("<think></think><keep>9, 2, 2, 40, 5</keep>", 10, 2)
    [1, 8]
    >>> kept_sentences("2 and 5", 10, 2) is None
    True
    """
    found = KEEP.search(reply)
    if found is None:
        return None
    kept: list[int] = []
    for number in re.findall(r"\d+", found.group(1)):
        index = int(number) - 1
        if 0 <= index < n_sentences and index not in kept:
            kept.append(index)
        if len(kept) == budget:
            break
    return sorted(kept)


def summary_text(reply: str, sentences: list[str], mode: Mode, budget: int) -> str | None:
    """What the reader sees of a reply; None when the reply has no summary in the format.

    >>> summary_text("<keep>2</keep>", ["A b.", "C d."], "extractive", 12)
    'C d.'
    >>> summary_text("<summary>Ostern makes rope.</summary>", [], "abstractive", 10)
    'Ostern mak'
    """
    if mode == "extractive":
        kept = kept_sentences(reply, len(sentences), budget)
        return None if kept is None else " ".join(sentences[i] for i in kept)
    found = SUMMARY.search(reply)
    return None if found is None else found.group(1).strip()[:budget]


def extractive_reply(kept: list[int]) -> str:
    """The reply in the extractive format that keeps the 0-based sentences `kept`.

    >>> extractive_reply([0, 3])
    '<keep>1, 4</keep>'
    """
    return "<keep>" + ", ".join(str(k + 1) for k in kept) + "</keep>"
