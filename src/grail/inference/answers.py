"""A model's answers to prompts that offer numbered options: its completions and, per row, a
choice distribution over the options (:class:`Answers`), the probabilities of the option-number
tokens (:func:`option_token_ids`) where the answer goes (the prompt, the model's own
completion up to ``<answer>``), renormalised over the options; the method that gave them is
recorded. Local models read them from their logits (:mod:`grail.inference.local`), API models
from the server's top logprobs or sampled answers (:mod:`grail.inference.remote`).
"""

from __future__ import annotations

from dataclasses import dataclass

ANSWER_TAG = "<answer>"


TOP_LOGPROBS = 20  # what vLLM and the OpenAI API return at most per position


def renormalised(weights: list[float]) -> list[float]:
    """Weights over a slate as probabilities (uniform when they are all zero).

    >>> renormalised([1.0, 3.0]), renormalised([0.0, 0.0])
    ([0.25, 0.75], [0.5, 0.5])
    """
    total = sum(weights)
    if total <= 0:
        return [1 / len(weights)] * len(weights)
    return [w / total for w in weights]


def option_token_ids(tokenizer, options: int) -> list[int]:
    """The token of each option number 1..`options` (Qwen's pre-tokenizer keeps every digit a
    token of its own; a number of several tokens is represented by its first)."""
    return [tokenizer.encode(str(k), add_special_tokens=False)[0] for k in range(1, options + 1)]


@dataclass
class Answers:
    """A model's completions and, per row, its choice distribution over the slate (displayed
    order as asked); `method` says how the distribution was obtained."""

    completions: list[str | None]
    distributions: list[list[float]]
    method: str


def thought_text(completion: str | None) -> str:
    """The thought a reply wrote: after ``<think>``, up to ``</think>`` (or an ``<answer>``
    it opened without closing the thought, or its end), stripped; a reply that starts inside
    its thought (a chat template whose generation prompt opens ``<think>``, as DeepSeek-R1's
    does) has the text before its ``</think>``.

    >>> thought_text("<think> pro-gun </think><answer>2</answer>"), thought_text("<think>a")
    ('pro-gun', 'a')
    >>> thought_text("a left-leaning viewer </think><answer>1</answer>")
    'a left-leaning viewer'
    >>> thought_text("<think></think><answer>1</answer>"), thought_text("2"), thought_text(None)
    ('', '', '')
    """
    text = completion or ""
    if "<think>" not in text:
        return text.split("</think>", 1)[0].strip() if "</think>" in text else ""
    text = text.split("<think>", 1)[1]
    return text.split("</think>", 1)[0].split(ANSWER_TAG, 1)[0].strip()


def thinks(completions: list[str | None], share: float) -> bool:
    """Whether a model thinks: at least `share` of its greedy replies (and one) wrote a thought.

    >>> thinks(["<think>x</think><answer>1</answer>"] + ["<answer>1</answer>"] * 19, 0.05)
    True
    >>> thinks(["<think></think><answer>1</answer>"] * 20, 0.05), thinks([], 0.05)
    (False, False)
    """
    written = sum(bool(thought_text(c)) for c in completions)
    return written > 0 and written >= share * len(completions)


def mixed(distributions: list[list[float]], k: int) -> list[list[float]]:
    """Each row's mixture of its `k` consecutive distributions (equal weights: k sampled
    thoughts, each the model's own draw).

    >>> mixed([[1.0, 0.0], [0.5, 0.5], [0.2, 0.8], [0.4, 0.6]], 2)
    [[0.75, 0.25], [0.30000000000000004, 0.7]]
    """
    rows = [distributions[start : start + k] for start in range(0, len(distributions), k)]
    return [[sum(column) / k for column in zip(*row, strict=True)] for row in rows]


def answer_prefix(completion: str | None) -> str:
    """The completion up to where the option number goes; ``<answer>`` is appended when the
    model did not write it (after its ``</think>`` when there is one).

    >>> answer_prefix("<think>x</think><answer>2</answer>"), answer_prefix("<think>y</think>")
    ('<think>x</think><answer>', '<think>y</think><answer>')
    >>> answer_prefix(None)
    '<answer>'
    """
    text = completion or ""
    at = text.find(ANSWER_TAG)
    if at >= 0:
        return text[: at + len(ANSWER_TAG)]
    end = text.find("</think>")
    return (text[: end + len("</think>")] if end >= 0 else "") + ANSWER_TAG


def distribution_from_top(top: dict[str, float], options: int) -> list[float]:
    """A slate distribution from one position's top logprobs (token text -> logprob); an
    option missing from them gets the smallest logprob returned (at most that likely).

    >>> import math
    >>> [round(p, 3) for p in distribution_from_top({"1": math.log(.6), "2": math.log(.2),
    ...     " ": math.log(.1)}, 3)]
    [0.667, 0.222, 0.111]
    >>> [round(p, 3) for p in distribution_from_top({"1": math.log(.6), "²": math.log(.3),
    ...     "١": math.log(.1)}, 2)]  # digits of other scripts are no option's number
    [0.857, 0.143]
    """
    import math

    numbers: dict[int, float] = {}
    for token, logprob in top.items():
        text = token.strip()
        if text.isascii() and text.isdigit() and 1 <= int(text) <= options:
            numbers[int(text)] = max(numbers.get(int(text), -math.inf), logprob)
    floor = min(top.values()) if top else 0.0
    return renormalised([math.exp(numbers.get(k, floor)) for k in range(1, options + 1)])


def sampled_distribution(answers: list[int | None], options: int) -> list[float]:
    """The empirical distribution of k sampled answers, add-half smoothed (a count of zero
    would give an infinite log-loss).

    >>> sampled_distribution([1, 1, 2, None], 2)
    [0.625, 0.375]
    """
    counts = [sum(a == k for a in answers) + 0.5 for k in range(1, options + 1)]
    return renormalised(counts)
