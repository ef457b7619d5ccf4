"""Reward functions in TRL's contract: ``f(prompts, completions, **columns) -> list[float | None]``.

``completions`` are strings or conversational lists (``[{"role": "assistant", "content": ...}]``);
dataset columns (``gold_index``, ``n_options``, ``opinion_direction``) arrive as keyword lists. A
reward returns ``None`` for a row it does not apply to (TRL then ignores it for that row).

Use by name from :data:`REWARDS` or by dotted path (``my_pkg.rewards:my_reward``), with weights
normalized to sum to one: ``resolve_rewards(["accuracy", "format"], [2, 1])``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence

from grail.core.errors import GrailError

# The number inside <answer>, in the forms models write: 3, 3., (3), Option 3, option (3).
CHOICE = r"(?:option\s*)?\(?\s*(\d+)\s*\)?\s*\.?"
ANSWER = re.compile(rf"<answer>\s*{CHOICE}\s*</answer>", re.IGNORECASE)
BARE = re.compile(rf"^\s*{CHOICE}\s*$", re.IGNORECASE)  # a reply that is only the choice
OPINION = re.compile(r"<opinion>\s*(increase|decrease|no_change)\s*</opinion>", re.IGNORECASE)
FORMAT = re.compile(
    r"^\s*<think>.*?</think>\s*<answer>\s*\d+\s*</answer>"
    r"(?:\s*<opinion>\s*(?:increase|decrease|no_change)\s*</opinion>)?\s*$",
    re.DOTALL | re.IGNORECASE,
)

RewardFunc = Callable[..., list[float | None]]


def completion_text(completion) -> str:
    """The text of a completion, plain or conversational.

    >>> completion_text([{"role": "assistant", "content": "<answer>2</answer>"}])
    '<answer>2</answer>'
    """
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion)


def parse_answer(text: str, n_options: int | None = None) -> int | None:
    """The option number in the last ``<answer>`` tag (or a reply that is only the choice);
    None when missing or out of range. Rewards and the benchmark both score with it.

    >>> parse_answer("<think>left-leaning</think><answer> 3 </answer>", n_options=4)
    3
    >>> [parse_answer(f"<answer>{a}</answer>") for a in ("3.", "Option 3", "(3)", "option (3)")]
    [3, 3, 3, 3]
    >>> parse_answer("3"), parse_answer("Option 2."), parse_answer("I pick 3 or 4")
    (3, 2, None)
    >>> parse_answer("<answer>7</answer>", n_options=4) is None
    True
    """
    found = ANSWER.findall(text) or BARE.findall(text)
    if not found:
        return None
    answer = int(found[-1])
    if answer < 1 or (n_options is not None and answer > n_options):
        return None
    return answer


def parse_opinion(text: str) -> str | None:
    """The direction in the last ``<opinion>`` tag, lower-cased; None when missing.

    >>> parse_opinion("<opinion>No_Change</opinion>")
    'no_change'
    """
    found = OPINION.findall(text)
    return found[-1].lower() if found else None


def accuracy_reward(prompts, completions, gold_index, n_options=None, **_) -> list[float]:
    """1 when the answer equals ``gold_index``; 0 when wrong, unparsable or out of range.

    >>> accuracy_reward(None, ["<answer>2</answer>", "<answer>5</answer>", "two"],
    ...                 gold_index=[2, 5, 2], n_options=[4, 4, 4])
    [1.0, 0.0, 0.0]
    """
    sizes = n_options if n_options is not None else [None] * len(completions)
    return [
        float(parse_answer(completion_text(c), n) == gold)
        for c, gold, n in zip(completions, gold_index, sizes, strict=True)
    ]


def choice_reply(option: int, opinion: str | None = None) -> str:
    """The reply in the answer format that picks `option` (and states `opinion`): what
    behaviour cloning trains toward, and what every reward here scores in full.

    >>> reply = choice_reply(3, "increase")
    >>> reply, format_reward(None, [reply]), parse_answer(reply, n_options=4)
    ('<think></think><answer>3</answer><opinion>increase</opinion>', [1.0], 3)
    """
    return f"<think></think><answer>{option}</answer>" + (
        f"<opinion>{opinion}</opinion>" if opinion else ""
    )


def format_reward(prompts, completions, **_) -> list[float]:
    """1 when the completion is exactly ``<think>..</think><answer>N</answer>[<opinion>..]``.

    >>> format_reward(None, ["<think>x</think><answer>1</answer>", "<answer>1</answer> extra"])
    [1.0, 0.0]
    """
    return [float(bool(FORMAT.match(completion_text(c)))) for c in completions]


def tag_count_reward(prompts, completions, **_) -> list[float]:
    """0.25 for each of <think>, </think>, <answer>, </answer> that appears exactly once.

    >>> tag_count_reward(None, ["<think>a</think><answer>1</answer>", "<answer>1"])
    [1.0, 0.25]
    """
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return [sum(0.25 for tag in tags if completion_text(c).count(tag) == 1) for c in completions]


def opinion_reward(prompts, completions, opinion_direction=None, **_) -> list[float | None]:
    """1 when ``<opinion>`` matches the labelled direction; None where the row has no label.

    >>> completions = ["<opinion>increase</opinion>", "no tag", "<opinion>decrease</opinion>"]
    >>> opinion_reward(None, completions, opinion_direction=["increase", "decrease", None])
    [1.0, 0.0, None]
    """
    labels = opinion_direction or [None] * len(completions)
    return [
        None if label is None else float(parse_opinion(completion_text(c)) == label)
        for c, label in zip(completions, labels, strict=True)
    ]


REWARDS: dict[str, RewardFunc] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "opinion": opinion_reward,
}


def resolve_reward(name: str, registry: dict[str, RewardFunc] | None = None) -> RewardFunc:
    """A registered reward by name, or a callable by dotted path (``pkg.mod:func``, ``pkg.mod.f``).

    >>> resolve_reward("accuracy") is accuracy_reward
    True
    >>> resolve_reward("grail.core.rewards:format_reward") is format_reward
    True
    """
    registry = REWARDS if registry is None else registry
    if name in registry:
        return registry[name]
    module_name, _, attribute = name.replace(":", ".").rpartition(".")
    if not module_name:
        raise GrailError(f"unknown reward {name!r}: use one of {sorted(registry)} or a dotted path")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise GrailError(f"cannot import reward {name!r}: {err}") from None
    if not callable(function):
        raise GrailError(f"reward {name!r} is not callable")
    return function


def normalize_weights(weights: Sequence[float] | None, count: int) -> list[float]:
    """Weights scaled to sum to 1 (equal when not given).

    >>> normalize_weights([2, 1, 1], 3)
    [0.5, 0.25, 0.25]
    """
    weights = [1.0] * count if not weights else [float(w) for w in weights]
    if len(weights) != count:
        raise GrailError(f"{len(weights)} reward weights for {count} reward functions")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise GrailError(f"reward weights must be non-negative with a positive sum, got {weights}")
    return [w / sum(weights) for w in weights]


def resolve_rewards(
    names: Sequence[str],
    weights: Sequence[float] | None = None,
    registry: dict[str, RewardFunc] | None = None,
) -> tuple[list[RewardFunc], list[float]]:
    """Reward functions and their normalized weights, ready for ``GRPOTrainer``; names from
    `registry` (a task's rewards; default the slate task's :data:`REWARDS`)."""
    return [resolve_reward(n, registry) for n in names], normalize_weights(weights, len(names))
