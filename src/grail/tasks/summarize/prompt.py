"""The summarize task's prompt and answer format, in one place.

Two modes, each with its budget stated in the prompt (no hidden gate):

- ``extractive`` (the embedded default): each sentence is followed by its id, a letter in
  brackets (``a`` to ``z``, then ``A`` to ``Z``, then two letters); the model keeps at most
  `budget` sentences by id, ``<keep>[c][g][L]</keep>``. Ids past the budget, repeated or unknown
  are ignored, and the prompt says so. Why letters after the sentence: Qwen's pre-tokenizer
  splits every number into single digits, so sentence 17 was the tokens "1" and "7" *before*
  its sentence, and a 2-layer model had to find both digits and read on to learn what the
  sentence said. A letter is one token in the prompt and the same token in the reply, and
  after the sentence it can hold what attention read of the sentence (docs/tasks.md).
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

SYSTEM = {
    "extractive": (
        "You summarize documents for a reader who will answer questions you do not see. "
        "Keep the sentences that state the facts about the document's subject: reply with "
        "their ids (the letter in brackets after each sentence) in <keep></keep>, at most "
        "{budget} of them (any further ids are ignored), e.g. <keep>[a][d][k]</keep>."
    ),
    "abstractive": (
        "You summarize documents for a reader who will answer questions you do not see. "
        "Write a summary that conveys the facts about the document's subject in "
        "<summary></summary>, at most {budget} characters (the reader sees no more)."
    ),
}
KEEP = re.compile(r"<keep>(.*?)</keep>", re.DOTALL)
SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def sentence_id(index: int) -> str:
    """The id of the 0-based sentence `index`: a to Z, then aa, ab, ... (bijective base 52).

    >>> [sentence_id(k) for k in (0, 25, 26, 51, 52, 53)]
    ['a', 'z', 'A', 'Z', 'aa', 'ab']
    """
    letters, k = "", index + 1
    while k:
        k, digit = divmod(k - 1, len(LETTERS))
        letters = LETTERS[digit] + letters
    return letters


def sentence_index(letters: str) -> int:
    """The 0-based sentence of an id (:func:`sentence_id`'s inverse); -1 for a non-id.

    >>> sentence_index("a"), sentence_index("Z"), sentence_index("ab"), sentence_index("1")
    (0, 51, 53, -1)
    """
    k = 0
    for letter in letters:
        digit = LETTERS.find(letter)
        if digit < 0:
            return -1
        k = k * len(LETTERS) + digit + 1
    return k - 1


def user_prompt(sentences: list[str], mode: Mode) -> str:
    """The document as the model sees it: each sentence followed by its id (extractive), or
    running text.

    >>> print(user_prompt(["Ostern makes rope.", "Rain is common."], "extractive"))
    DOCUMENT
    Ostern makes rope. [a]
    Rain is common. [b]
    """
    if mode == "extractive":
        body = "\n".join(f"{s} [{sentence_id(k)}]" for k, s in enumerate(sentences))
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
    ``<keep>`` tag. The first `budget` valid distinct ids count (brackets and separators are
    not needed).

    >>> kept_sentences("<think></think><keep>[i][b][b][Z][e]</keep>", 10, 2)
    [1, 8]
    >>> kept_sentences("<keep>b, e</keep>", 10, 5), kept_sentences("[b] and [e]", 10, 2)
    ([1, 4], None)
    """
    found = KEEP.search(reply)
    if found is None:
        return None
    kept: list[int] = []
    for letters in re.findall(r"[A-Za-z]+", found.group(1)):
        index = sentence_index(letters)
        if 0 <= index < n_sentences and index not in kept:
            kept.append(index)
        if len(kept) == budget:
            break
    return sorted(kept)


def summary_text(reply: str, sentences: list[str], mode: Mode, budget: int) -> str | None:
    """What the reader sees of a reply; None when the reply has no summary in the format.

    >>> summary_text("<keep>[b]</keep>", ["A b.", "C d."], "extractive", 12)
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
    '<keep>[a][d]</keep>'
    """
    return "<keep>" + "".join(f"[{sentence_id(k)}]" for k in kept) + "</keep>"
