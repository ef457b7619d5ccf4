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

from grail.core.rewards import completion_text
from grail.tasks.summarize.prompt import kept_sentences, summary_text
from grail.tasks.summarize.reader import questions_answered


def answered_reward(
    prompts, completions, sentences, questions, summary_mode, summary_budget, **_
) -> list[float]:
    """Share of questions answered from each completion's summary.

    >>> q = [{"entity_aliases": ["Ostern"], "cues": ["bridge"], "answer_aliases": ["12"]}]
    >>> doc = ["Ostern has 12 bridges.", "Rain fell."]
    >>> answered_reward(None, ["<keep>1</keep>", "<keep>2</keep>", "1"], [doc] * 3, [q] * 3,
    ...                 ["extractive"] * 3, [12] * 3)
    [1.0, 0.0, 0.0]
    """
    rewards = []
    for completion, document, asked, mode, budget in zip(
        completions, sentences, questions, summary_mode, summary_budget, strict=True
    ):
        summary = summary_text(completion_text(completion), document, mode, budget)
        verdicts = questions_answered(summary, asked) if summary is not None else [False]
        rewards.append(sum(verdicts) / len(verdicts))
    return rewards


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
