"""The slate task's part of behaviour cloning (``sft_dataset: choices``, the SFT warm start of
:mod:`grail.train.sft`): each train prompt, as GRPO sees it, with the reply that picks the
option the person chose."""

from __future__ import annotations

from pathlib import Path

from grail.tasks.slate.examples import prompt_options, rows
from grail.tasks.slate.prompts import to_example
from grail.tasks.slate.rewards import choice_reply


def cloned_choices(
    config, folder: Path, split: str, limit: int | None
) -> tuple[list[dict], list[dict]]:
    """The rows of `split` (:func:`grail.tasks.slate.examples.rows`) and, for each, its prompt
    as GRPO sees it (the options shuffled alike), its slate's size and the reply that picks the
    option the person chose (with the opinion task, stating their opinion's direction)."""
    found = rows(config, folder, split, limit)
    options = prompt_options(config)
    cloned = []
    for row in found:
        example = to_example(row, options)
        opinion = example["opinion_direction"] if config.opinion else None
        cloned.append(
            {
                "prompt": example["prompt"],
                "n_options": example["n_options"],
                "reply": choice_reply(example["gold_index"], opinion),
            }
        )
    return found, cloned


def longest_answer(config) -> str:
    """The longest answer a cloned reply closes its thought with (a two-digit option and, with
    the opinion task, an opinion): what a cloned thought's token budget leaves room for.

    >>> from types import SimpleNamespace
    >>> longest_answer(SimpleNamespace(opinion=False))
    '<answer>99</answer>'
    >>> longest_answer(SimpleNamespace(opinion=True))
    '<answer>99</answer><opinion>increase</opinion>'
    """
    return choice_reply(99, "increase" if config.opinion else None).split("</think>", 1)[1]
