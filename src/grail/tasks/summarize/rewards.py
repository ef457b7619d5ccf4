"""The summarize task's rewards in TRL's contract: each takes the completions and the dataset's
columns (``sentences``, ``questions``, ``summary_mode``, ``summary_budget``, one per completion)
and returns one float per completion.

- ``answered``: the share of the document's hidden questions the reader answers from the
  summary (Summary-RL's reward, over 5 rather than a count); a reply with no summary in the
  format answers nothing;
- ``summary_format``: 1 when the reply holds a summary in the format the prompt asks for.

(``budget_used``, the share of the budget filled, is gone: the tiny summarizer's warm-up now
fills the budget, and a reward that knows no question only paid for length.)

A completion whose every read failed (the model reader or judge gave no verdict) gets None
from every reward, so that TRL 1.16 leaves it out of its group's baseline and gives it no
advantage (``GRPOTrainer._generate_and_score_completions``: a row is unscorable only when every
reward function returned None; one float from any reward and it trains as if it answered
nothing). The reads are made once per batch and shared by the rewards. Training stops in one
line when more than ``MISSING_LIMIT`` of the run's verdicts are missing.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from grail.core.errors import GrailError
from grail.core.rewards import completion_text
from grail.tasks.summarize.prompt import summary_text
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
    >>> answered_reward(None, ["<keep>[a]</keep>", "<keep>[b]</keep>", "a"], [doc] * 3, [q] * 3,
    ...                 ["extractive"] * 3, [12] * 3)
    [1.0, 0.0, 0.0]
    """
    summaries = summaries_of(completions, sentences, summary_mode, summary_budget)
    if summary_reader and summary_reader[0]:
        verdicts = model_verdicts(summaries, questions, sentences, summary_reader, summary_judge)
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


MISSING_LIMIT = 0.2  # the share of a run's verdicts that may be missing before training stops
MISSING_AFTER = 20  # verdicts asked before the limit is checked


class ReaderFailing(GrailError):
    """The model reader or judge failed on more than MISSING_LIMIT of a run's verdicts: every
    value was in range; the endpoint is down or overloaded (exit 1)."""

    exit_code = 1


def summaries_of(completions, sentences, summary_mode, summary_budget) -> list[str | None]:
    """Each completion's summary (None without one in the asked format)."""
    return [
        summary_text(completion_text(completion), document, mode, budget)
        for completion, document, mode, budget in zip(
            completions, sentences, summary_mode, summary_budget, strict=True
        )
    ]


_LAST_READ: dict = {}  # the batch read last: every reward of one batch shares its verdicts


def model_verdicts(summaries, questions, sentences, summary_reader, summary_judge) -> list[list]:
    """The model reader's verdicts on a batch's summaries (the judge sees each document), read
    once for all the rewards that ask; raises :class:`ReaderFailing` past the missing limit."""
    reader = reader_for(summary_reader[0], (summary_judge or [None])[0])
    asked = tuple(q.get("question_id") or q["question"] for qs in questions for q in qs)
    key = (reader.reader, reader.judge, tuple(summaries), asked)
    if _LAST_READ.get("key") != key:
        _LAST_READ.clear()
        documents = [" ".join(document) for document in sentences]
        _LAST_READ.update(key=key, verdicts=reader.read(summaries, questions, documents))
        check_missing(reader)
    return _LAST_READ["verdicts"]


def check_missing(reader) -> None:
    """Stop training, in one line, once more than MISSING_LIMIT of the run's verdicts (after
    the first MISSING_AFTER) could not be given."""
    counts = reader.counts
    missing = counts.reader_failed + counts.judge_failed
    if counts.questions >= MISSING_AFTER and missing > MISSING_LIMIT * counts.questions:
        raise ReaderFailing(
            f"summary_reader: {missing} of {counts.questions} verdicts missing "
            f"({counts.reader_failed} reader, {counts.judge_failed} judge failures), more than "
            f"{MISSING_LIMIT:.0%}: training stopped ({reader.reader}"
            + (f", judge {reader.judge}" if reader.judge else "")
            + "; check the endpoint, or its concurrency)"
        )


def unread(completions, sentences, summary_mode, summary_budget, kwargs) -> list[bool]:
    """Which completions' reads all failed (always none with the deterministic reader)."""
    summary_reader = kwargs.get("summary_reader")
    if not (summary_reader and summary_reader[0]):
        return [False] * len(completions)
    summaries = summaries_of(completions, sentences, summary_mode, summary_budget)
    verdicts = model_verdicts(
        summaries, kwargs["questions"], sentences, summary_reader, kwargs.get("summary_judge")
    )
    return [bool(given) and all(v is None for v in given) for given in verdicts]


@lru_cache(maxsize=4)
def reader_for(reader: str, judge: str | None):
    """One model reader per reader and judge for the whole training run."""
    from grail.tasks.summarize.model_reader import ModelReader

    return ModelReader(reader, judge)


def summary_format_reward(
    prompts, completions, sentences, summary_mode, summary_budget, **kwargs
) -> list[float | None]:
    """1 when the reply holds a summary in the asked format (None where every read failed).

    >>> summary_format_reward(None, ["<keep>[a]</keep>", "keep a"], [["A."]] * 2,
    ...                       ["extractive"] * 2, [12] * 2)
    [1.0, 0.0]
    """
    lost = unread(completions, sentences, summary_mode, summary_budget, kwargs)
    return [
        None if failed else float(summary is not None)
        for summary, failed in zip(
            summaries_of(completions, sentences, summary_mode, summary_budget), lost, strict=True
        )
    ]


REWARDS: dict[str, Callable[..., list[float]]] = {
    "answered": answered_reward,
    "summary_format": summary_format_reward,
}

POLICY_REWARD = None  # no reward here reads the policy: each reads the reply alone
# a recipe without reward_funcs: Summary-RL's reward and the format that makes it readable
DEFAULT_REWARDS = ["answered", "summary_format"]
REWARD_NOTES = {
    "answered": "the share of the document's hidden questions a reader answers from the "
    "summary (Summary-RL's; optimal at the summary that answers most)",
    "summary_format": "1 when the reply holds a summary in the format the prompt asks for",
}
