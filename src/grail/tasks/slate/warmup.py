"""The slate task's tiny-model warm-up (:mod:`grail.train.tiny`): its conversations (a cleaned
dataset's prompts, or a small study simulated and cleaned on the spot), the answer tags the
tokenizer learns, and the format warm-up whose target at the option number is uniform over the
slate (or people's position frequencies)."""

from __future__ import annotations

import logging
from pathlib import Path

from grail.core.outputs import work_folder
from grail.core.progress import Progress
from grail.core.warmup import reply_logits, take_step, warmup_optimizer
from grail.inference.answers import option_token_ids

logger = logging.getLogger(__name__)

# the option number trained toward uniform over the slate, or people's position frequencies
TARGETS = ("uniform", "positions")
STEPS = 150  # the embedded default's warm-up: its sampled replies keep the format

FORMAT_PREFIX = "<think></think><answer>"  # the warm-up's reply, up to the number (no thought)
FORMAT_SUFFIX = "</answer>"
ANSWER_SAMPLES = [f"{FORMAT_PREFIX}{k}{FORMAT_SUFFIX}" for k in range(1, 9)] + [
    f"<opinion>{d}</opinion>" for d in ("increase", "decrease", "no_change")
]


def conversations(data: str | Path | None, limit: int = 3000) -> list[list[dict[str, str]]]:
    """Prompt messages from a cleaned dataset's train split (the validation rows are never
    read, even as text), or from a small study simulated on the spot."""
    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import PromptOptions, build_messages

    if data is None:
        from grail.tasks.slate.clean import clean_steps
        from grail.tasks.slate.simulate import simulate

        logger.info("no dataset given: simulating a 200-participant study for the text")
        with work_folder("tiny") as tmp:
            simulate(Path(tmp) / "raw", participants=200, seed=1)
            clean_steps(Path(tmp) / "raw", Path(tmp) / "clean")
            return conversations(Path(tmp) / "clean", limit)
    rows = read_dataset(data, split="train").slice(0, limit).to_pylist()
    return [
        build_messages(row, PromptOptions(history_depth=3))
        + [
            {
                "role": "assistant",
                "content": f"{FORMAT_PREFIX}{1 + k % row['n_options']}{FORMAT_SUFFIX}",
            }
        ]
        for k, row in enumerate(rows)
    ]


def position_frequencies(data: str | Path, limit: int = 3000) -> dict[int, list[float]]:
    """How often people chose each display position, per slate size (add-one smoothed), over
    the rows :func:`conversations` reads."""
    from grail.tasks.slate.contract import read_dataset

    counts: dict[int, list[int]] = {}
    for row in read_dataset(data, split="train").slice(0, limit).to_pylist():
        sizes = counts.setdefault(row["n_options"], [1] * row["n_options"])
        sizes[row["gold_index"] - 1] += 1
    return {n: [c / sum(seen) for c in seen] for n, seen in counts.items()}


def teach_format(
    model,
    tokenizer,
    chats: list[list[dict[str, str]]],
    steps: int,
    seed: int = 0,
    batch_size: int = 8,
    lr: float = 6e-3,
    targets: dict[int, list[float]] | None = None,
    prompt_weight: float = 0.0,
) -> list[float]:
    """Teacher-force the answer format for a few steps, so GRPO on a tiny model sees rewards vary.

    The loss covers the reply: the tags and fixed thought as usual, and at the option
    number a cross-entropy against the uniform distribution over the slate's numbers (1..n), or
    ``targets[n]`` (n: the slate size): with the uniform target the model starts
    position-neutral; and, at `prompt_weight`, the prompt's own text as a language model reads
    it (no choice in it: the warm-up's reply is not the person's). The rate decays to 0 and
    gradients are clipped, so sampled replies keep the format (docs/training.md, "Tiny
    model"). Returns the losses.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer, schedule = warmup_optimizer(model, lr, steps)
    prefix = tokenizer(FORMAT_PREFIX, add_special_tokens=False)["input_ids"]
    suffix = tokenizer(FORMAT_SUFFIX + "<|im_end|>", add_special_tokens=False)["input_ids"]
    sizes = [_options_in_prompt(chat) for chat in chats]
    digits = option_token_ids(tokenizer, max(sizes))
    prompts: dict[int, list[int]] = {}  # tokenized when first drawn (the demo draws a third)

    def prompt(i: int) -> list[int]:
        if i not in prompts:
            text = tokenizer.apply_chat_template(
                chats[i][:-1], tokenize=False, add_generation_prompt=True
            )
            prompts[i] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return prompts[i]

    def target(n: int):
        weights = targets.get(n) if targets else None
        return torch.tensor(weights) if weights else torch.full((n,), 1 / n)

    losses = []
    progress = Progress("format warm-up steps", steps)
    model.train()
    for _ in range(steps):
        picks = torch.randint(len(chats), (batch_size,), generator=generator).tolist()
        shown = [
            int(torch.randint(sizes[i], (1,), generator=generator)) for i in picks
        ]  # the number fed to the model after the digit (the suffix must follow any of them)
        width = max(len(prompt(i)) + len(prefix) + 1 + len(suffix) for i in picks)
        pad = tokenizer.pad_token_id
        ids, labels, mask, at = [], [], [], []
        for i, k in zip(picks, shown, strict=True):
            reply = [*prefix, digits[k], *suffix]
            fill = width - len(prompts[i]) - len(reply)  # right padding
            ids.append(prompts[i] + reply + [pad] * fill)
            labels.append([-100] * len(prompts[i]) + reply + [-100] * fill)
            labels[-1][len(prompts[i]) + len(prefix)] = -100  # the number: soft target below
            mask.append([1] * (len(prompts[i]) + len(reply)) + [0] * fill)
            at.append(len(prompts[i]) + len(prefix) - 1)  # the logits that predict the number
        replies, logits = reply_logits(model, ids, mask, labels, at, prompt_weight)
        logprobs = logits.log_softmax(-1)
        number = torch.stack(
            [
                slate_target_loss(logits[row], logprobs[row], digits, sizes[i], target(sizes[i]))
                for row, i in enumerate(picks)
            ]
        ).mean()
        loss = replies + number
        losses.append(take_step(loss, model, optimizer, schedule))
        progress.update(len(losses), f"loss {losses[-1]:.3f}")
    model.eval()
    return losses


def slate_target_loss(logits, logprobs, digits: list[int], size: int, target):
    """The warm-up's loss at the option number of one row: cross-entropy of `target` against
    the softmax over the slate's numbers (the first `size` of `digits`), plus -log of the
    mass the vocabulary puts on the option numbers as a set (`digits`: every slate's, so the
    set term favours none of them). Against the vocabulary's softmax instead, a uniform target
    over 1..4 on the 4-option slates (most of them) pushes "5" down wherever it stands, and a
    model that cannot count the options gives option 5 of 5-option slates almost nothing.

    >>> import torch
    >>> logits = torch.tensor([0.0, 0.0, 0.0, 5.0])  # vocabulary: '1', '2', '3', another token
    >>> loss = slate_target_loss(logits, logits.log_softmax(-1), [0, 1, 2], 2,
    ...                          torch.tensor([.5, .5]))
    >>> round(loss.item(), 4)  # log 2 (uniform over the slate) + 3.9214 (mass off the numbers)
    4.6145
    """
    on_slate = logits[digits[:size]].log_softmax(-1)
    return -(target * on_slate).sum() - logprobs[digits].logsumexp(-1)


def _options_in_prompt(chat: list[dict[str, str]]) -> int:
    """The number of OPTIONS lines in a conversation's user prompt."""
    options = chat[-2]["content"].rsplit("OPTIONS\n", 1)[-1]
    return len(options.splitlines())


def warm_up(
    model, tokenizer, chats: list[list[dict[str, str]]], steps: int, seed: int,
    data: str | Path | None, target: str, prompt_weight: float = 0.0,
) -> list[float]:  # fmt: skip
    """The slate task's format warm-up (:func:`teach_format`): the option number's target is
    uniform over the slate, or with ``target="positions"`` people's position frequencies in
    `data`; the prompts' own text read as a language model at `prompt_weight`."""
    targets = position_frequencies(data) if target == "positions" else None
    return teach_format(model, tokenizer, chats, steps, seed, targets=targets,
                        prompt_weight=prompt_weight)  # fmt: skip
