"""What every task's rewards share: TRL's reward contract
``f(prompts, completions, **columns) -> list[float | None]``, a completion's text, and resolving
rewards by name (a task's ``REWARDS``) or dotted path, with weights normalized to sum to one.
Each task's rewards live in its folder (:mod:`grail.tasks.slate.rewards`,
:mod:`grail.tasks.summarize.rewards`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from grail.core.errors import GrailError

RewardFunc = Callable[..., list[float | None]]


def completion_text(completion) -> str:
    """The text of a completion, plain or conversational.

    >>> completion_text([{"role": "assistant", "content": "<answer>2</answer>"}])
    '<answer>2</answer>'
    """
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion)


def opened(text: str) -> str:
    """A reply whose prompt opened its thought (a chat template whose generation prompt ends
    with ``<think>``, as a model cloned with thoughts has: ``sft_thoughts``) written out whole:
    a reply that closes a thought it never opened starts with ``<think>``.

    >>> opened("a thought</think><answer>1</answer>"), opened("<answer>1</answer>")
    ('<think>a thought</think><answer>1</answer>', '<answer>1</answer>')
    """
    return "<think>" + text if "</think>" in text and "<think>" not in text else text


def resolve_reward(name: str, registry: dict[str, RewardFunc | type]) -> RewardFunc:
    """A reward of `registry` (a task's ``REWARDS``) by name, or a callable by dotted path
    (``pkg.mod:func``, ``pkg.mod.f``).

    >>> resolve_reward("text", {"text": completion_text}) is completion_text
    True
    >>> resolve_reward("grail.core.rewards:completion_text", {}) is completion_text
    True
    """
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
    registry: dict[str, RewardFunc | type] | None = None,
) -> tuple[list[RewardFunc], list[float]]:
    """Reward functions and their normalized weights, ready for ``GRPOTrainer``; names from
    `registry` (a task's ``REWARDS``; none: dotted paths only)."""
    registry = {} if registry is None else registry
    return [resolve_reward(n, registry) for n in names], normalize_weights(weights, len(names))
