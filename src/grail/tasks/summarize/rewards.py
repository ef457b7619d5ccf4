"""The summarize task's rewards in TRL's contract: each takes the completions and the dataset's
columns (``sentences``, ``questions``, ``summary_mode``, ``summary_budget``, one per completion)
and returns one float per completion.

- ``answered``: the share of the document's hidden questions the reader answers from the
  summary (Summary-RL's reward, over 5 rather than a count); a reply with no summary in the
  format answers nothing;
- ``summary_format``: 1 when the reply holds a summary in the format the prompt asks for;
- ``budget_used``: the share of the stated budget the summary fills (distinct sentences kept
  over the budget, or characters over the budget). It knows nothing of the questions: the
  reader never penalizes a further sentence, so a summary under its budget only leaves answers
  unread, and repeated or out-of-range numbers fill nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from grail.core.rewards import completion_text
from grail.tasks.summarize.prompt import kept_sentences, summary_text
from grail.tasks.summarize.reader import questions_answered


def answered_reward(
    prompts,
    completions,
    sentences,
    questions,
    summary_mode,
    summary_budget,
    summary_reader=None,
    summary_judge=None,
    **_,
) -> list[float | None]:
    """Share of questions answered from each completion's summary: by the deterministic
    reader, or by the model reader and judge the dataset's ``summary_reader`` and
    ``summary_judge`` columns name (RepLiQA). A verdict the reader or judge could not give is
    left out of the share; a completion with none is None (TRL leaves it out, never 0).

    >>> q = [{"entity_aliases": ["Ostern"], "cues": ["bridge"], "answer_aliases": ["12"]}]
    >>> doc = ["Ostern has 12 bridges.", "Rain fell."]
    >>> answered_reward(None, ["<keep>1</keep>", "<keep>2</keep>", "1"], [doc] * 3, [q] * 3,
    ...                 ["extractive"] * 3, [12] * 3)
    [1.0, 0.0, 0.0]
    """
    summaries = [
        summary_text(completion_text(completion), document, mode, budget)
        for completion, document, mode, budget in zip(
            completions, sentences, summary_mode, summary_budget, strict=True
        )
    ]
    if summary_reader and summary_reader[0]:
        verdicts = reader_for(summary_reader[0], (summary_judge or [None])[0]).read(
            summaries, questions
        )
    else:
        verdicts = [
            questions_answered(s, asked) if s is not None else [False]
            for s, asked in zip(summaries, questions, strict=True)
        ]
    rewards: list[float | None] = []
    for given in verdicts:
        read = [v for v in given if v is not None]
        rewards.append(sum(read) / len(read) if read else None)
    return rewards


@lru_cache(maxsize=4)
def reader_for(reader: str, judge: str | None):
    """One model reader per reader and judge for the whole training run."""
    from grail.tasks.summarize.model_reader import ModelReader

    return ModelReader(reader, judge)


def summary_format_reward(
    prompts, completions, sentences, summary_mode, summary_budget, **_
) -> list[float]:
    """1 when the reply holds a summary in the asked format.

    >>> summary_format_reward(None, ["<keep>1</keep>", "keep 1"], [["A."]] * 2,
    ...                       ["extractive"] * 2, [12] * 2)
    [1.0, 0.0]
    """
    return [
        float(summary_text(completion_text(c), document, mode, budget) is not None)
        for c, document, mode, budget in zip(
            completions, sentences, summary_mode, summary_budget, strict=True
        )
    ]


def budget_used_reward(
    prompts, completions, sentences, summary_mode, summary_budget, **_
) -> list[float]:
    """Share of the budget each completion's summary fills (0 without a summary).

    >>> budget_used_reward(None, ["<keep>1, 1, 2, 9</keep>", "<summary>abcd</summary>", "1"],
    ...                    [["A.", "B."], [], ["A."]], ["extractive", "abstractive", "extractive"],
    ...                    [4, 8, 4])
    [0.5, 0.5, 0.0]
    """
    shares = []
    for c, document, mode, budget in zip(
        completions, sentences, summary_mode, summary_budget, strict=True
    ):
        text = completion_text(c)
        if mode == "extractive":
            kept = kept_sentences(text, len(document), budget)
            shares.append(len(kept or []) / budget)
        else:
            summary = summary_text(text, document, mode, budget)
            shares.append(len(summary or "") / budget)
    return shares


REWARDS: dict[str, Callable[..., list[float]]] = {
    "answered": answered_reward,
    "summary_format": summary_format_reward,
    "budget_used": budget_used_reward,
}
