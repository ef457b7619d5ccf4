"""Reward functions in TRL's contract: ``f(prompts, completions, **columns) -> list[float | None]``.

``completions`` are strings or conversational lists (``[{"role": "assistant", "content": ...}]``);
dataset columns (``gold_index``, ``n_options``, ``opinion_direction``) arrive as keyword lists. A
reward returns ``None`` for a row it does not apply to (TRL then ignores it for that row).

Use by name from :data:`REWARDS` or by dotted path (``my_pkg.rewards:my_reward``), with weights
normalized to sum to one: ``resolve_rewards(["accuracy", "format"], [2, 1], REWARDS)``
(:mod:`grail.core.rewards`).

Which objective a simulator of people needs (docs/training.md#objectives): ``accuracy`` pays for
the sampled answer being the person's choice; its expected value sum_a pi(a) p(a) is linear in
the policy and maximised by all mass on the likeliest option (mode-seeking; kept for fidelity to
upstream). ``log_score`` and ``brier`` are proper scoring rules of the policy's own choice
distribution q at the answer slot (:class:`PolicyScoreReward`): their expected value under
people's distribution p is maximised at q = p.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence

from grail.core.errors import GrailError
from grail.core.rewards import RewardFunc, completion_text, opened

logger = logging.getLogger(__name__)

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

ANSWER_TAG = "<answer>"
OPTIONS_HEADER = "\n\nOPTIONS\n"  # where a slate prompt's numbered options begin


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


def format_reward(prompts, completions, n_options=None, **_) -> list[float]:
    """1 when the completion is exactly ``<think>..</think><answer>N</answer>[<opinion>..]``
    (the ``<think>`` left out when the prompt opened it: :func:`opened`) and N is an option of
    its slate (``n_options``, when given): a reply naming an option the slate does not have is
    no answer (the discriminator leaves it to this reward).

    >>> format_reward(None, ["<think>x</think><answer>1</answer>", "<answer>1</answer> extra"])
    [1.0, 0.0]
    >>> format_reward(None, ["<think></think><answer>5</answer>"] * 2, n_options=[4, 5])
    [0.0, 1.0]
    >>> format_reward(None, [" a thought</think><answer>2</answer>", "x</think>y</think>"])
    [1.0, 0.0]
    """
    sizes = n_options if n_options is not None else [None] * len(completions)
    return [
        float(bool(FORMAT.match(opened(text))) and parse_answer(text, n) is not None)
        for text, n in zip(map(completion_text, completions), sizes, strict=True)
    ]


def tag_count_reward(prompts, completions, **_) -> list[float]:
    """0.25 for each of <think>, </think>, <answer>, </answer> that appears exactly once
    (``<think>`` counted where the prompt opened it: :func:`opened`).

    >>> tag_count_reward(None, ["<think>a</think><answer>1</answer>", "<answer>1"])
    [1.0, 0.25]
    >>> tag_count_reward(None, ["a</think><answer>1</answer>"])
    [1.0]
    """
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return [
        sum(0.25 for tag in tags if opened(completion_text(c)).count(tag) == 1) for c in completions
    ]


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


LOG_FLOOR = 1e-3  # the log score's lowest probability: log(0.001) = -6.9, never -inf


def log_score(q: Sequence[float], choice: int, floor: float = LOG_FLOOR) -> float:
    """The log score of distribution `q` over a slate for the 1-based `choice`, floored:
    ``max(log q(choice), log floor)``. Its expected value under p is maximised at q = p.

    >>> round(log_score([0.5, 0.25, 0.25], 2), 4), round(log_score([1.0, 0.0], 2), 4)
    (-1.3863, -6.9078)
    """
    return math.log(max(q[choice - 1], floor))


def quadratic_score(q: Sequence[float], choice: int) -> float:
    """The quadratic (Brier) score ``2 q(choice) - sum q^2``, in [-1, 1]; proper, like the log
    score, but bounded: a confident miss costs at most 2.

    >>> quadratic_score([0.5, 0.5], 1), quadratic_score([1.0, 0.0], 2)
    (0.5, -1.0)
    """
    return 2 * q[choice - 1] - sum(x * x for x in q)


class PolicyScoreReward:
    """A proper scoring rule of the policy's own choice distribution, as a TRL reward.

    For each completion, q is the policy's probability of each option number at the answer
    slot, after the prompt and the completion up to its ``<answer>`` (its thought), renormalised
    over the slate (as the benchmark reads a model); the reward is ``rule(q, gold_index)``. A
    completion without ``<answer>`` gets the rule's worst value. The sampled number itself does
    not enter: with empty thoughts every completion of a prompt shares q, and the group's
    advantages are 0 (docs/training.md#objectives).

    The policy and its tokenizer are bound when training begins (``bind``, from the trainer's
    callback); every process calls the policy on its own completions, the same number
    everywhere (a forward pass is a collective under ZeRO-3): one per `chunk` completions.
    Given a packer (the trainer's, :func:`grail.train.trainer.prefix_packer`, where the policy
    scores packed rows exactly), the completions of one prompt in a chunk are packed after one
    copy of it, as the scoring forwards pack each group; ``read`` counts the forwards and the
    positions they computed (padding included), for the step's accounting (bench/gpu.py).
    """

    __name__ = "policy_score"
    worst = 0.0
    chunk = 16  # completions per forward pass

    def __init__(self):
        self.policy = None
        self.tokenizer = None
        self.packer = None
        self.read = {"forwards": 0, "positions": 0, "completions": 0, "packed": 0}

    def rule(self, q: Sequence[float], choice: int) -> float:
        raise NotImplementedError

    def bind(self, policy, tokenizer, packer=None) -> None:
        """`packer(sequences, prompts)`: packed rows whose ``last_logits(model, columns)`` are
        each sequence's, or None where packing costs more."""
        self.policy, self.tokenizer, self.packer = policy, tokenizer, packer

    def __call__(self, prompts, completions, gold_index, n_options=None, **_) -> list[float]:
        if self.policy is None:
            raise GrailError(f"the {self.__name__} reward reads the policy: none is bound yet")
        texts = [completion_text(c) for c in completions]
        sizes = n_options if n_options is not None else [None] * len(texts)
        slates = [n or len(options_block(p)) for p, n in zip(prompts, sizes, strict=True)]
        # every completion is scored, with or without its tag: each process then runs the same
        # number of forward passes (collectives under ZeRO-3)
        chats = [self.chat(prompt) for prompt in prompts]
        thoughts = [text.partition(ANSWER_TAG)[0] + ANSWER_TAG for text in texts]
        found = self.distributions(chats, thoughts, [n or 1 for n in slates])
        return [
            self.rule(q, gold) if ANSWER_TAG in text and 1 <= gold <= n else self.worst
            for q, text, gold, n in zip(found, texts, gold_index, slates, strict=True)
        ]

    def chat(self, prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=True
        )

    def distributions(
        self, chats: list[str], thoughts: list[str], slates: list[int]
    ) -> list[list[float]]:
        """q over each row's slate from the policy's next-token logits after its chat and its
        thought (up to and with ``<answer>``)."""
        import torch

        from grail.inference.answers import option_token_ids

        if not chats:
            return []
        numbers = option_token_ids(self.tokenizer, max(slates))
        texts = [chat + thought for chat, thought in zip(chats, thoughts, strict=True)]
        shared = self.shared_prompts(chats, texts)
        training = self.policy.training
        self.policy.eval()
        logits = []
        try:
            with torch.no_grad():
                for start in range(0, len(texts), self.chunk):
                    piece = slice(start, start + self.chunk)
                    logits += self.option_logits(shared[piece], numbers)
        finally:
            self.policy.train(training)
        return [softmax(row[:n]) for row, n in zip(logits, slates, strict=True)]

    def shared_prompts(self, chats: list[str], texts: list[str]) -> list[tuple[list[int], int]]:
        """Each text's token ids and how many of them are its chat's (0 without a packer, or
        where the chat's own ids are not a prefix of the text's)."""
        encode = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        if self.packer is None:
            return [(ids, 0) for ids in encode]
        heads = self.tokenizer(chats, add_special_tokens=False)["input_ids"]
        return [
            (ids, len(head) if ids[: len(head)] == head else 0)
            for ids, head in zip(encode, heads, strict=True)
        ]

    def option_logits(self, shared, numbers) -> list[list[float]]:
        """One forward over a chunk (each text's ids and its chat's share of them): the option
        numbers' logits after each text, the rows of one prompt packed where that costs less,
        else left-padded rows (as TRL pads prompts)."""
        sequences = [ids for ids, _ in shared]
        packed = None
        if any(prompt for _, prompt in shared):
            packed = self.packer(sequences, [prompt for _, prompt in shared])
        self.read["forwards"] += 1
        self.read["completions"] += len(sequences)
        if packed is not None:
            self.read["packed"] += 1
            self.read["positions"] += packed.inputs["input_ids"].numel()
            return packed.last_logits(self.policy, numbers).float().tolist()
        batch = self.tokenizer.pad(
            {"input_ids": sequences}, padding=True, padding_side="left", return_tensors="pt"
        ).to(next(self.policy.parameters()).device)
        self.read["positions"] += batch["input_ids"].numel()
        return self.policy(**batch, logits_to_keep=1).logits[:, -1, numbers].float().tolist()


class LogScoreReward(PolicyScoreReward):
    """The log score ``max(log q(y), log 0.001)`` of the policy's choice distribution."""

    __name__ = "log_score"
    worst = math.log(LOG_FLOOR)

    def rule(self, q, choice):
        return log_score(q, choice)


class BrierReward(PolicyScoreReward):
    """The quadratic score ``2 q(y) - sum q^2`` of the policy's choice distribution."""

    __name__ = "brier"
    worst = -1.0

    def rule(self, q, choice):
        return quadratic_score(q, choice)


def softmax(logits: Sequence[float]) -> list[float]:
    """Logits as probabilities.

    >>> softmax([0.0, 0.0])
    [0.5, 0.5]
    """
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]


def options_block(prompt) -> list[str]:
    """The OPTIONS lines of a slate prompt (the last user message's).

    >>> options_block([{"role": "user", "content": "VIEWER\\nx\\n\\nOPTIONS\\n1. A\\n2. B"}])
    ['1. A', '2. B']
    """
    _, _, options = user_text(prompt).partition(OPTIONS_HEADER)
    return options.split("\n") if options else []


def user_text(prompt) -> str:
    """The text of a prompt's last user message (a plain prompt is its own)."""
    if isinstance(prompt, str):
        return prompt
    return next(m["content"] for m in reversed(prompt) if m["role"] == "user")


def accuracy_optimum_log_loss(
    choices: Sequence[tuple[int, int]], ratio: float
) -> tuple[float, float]:
    """Where the accuracy reward leads a simulator that knows only the position prior.

    With weight w and TRL's KL pull beta toward a position-neutral start, the policy that
    maximises ``w * accuracy - beta * KL`` is pi* proportional to exp((w / beta) p) (Korbak et al.
    2022), p the position frequencies of slates of each size. Returns (the expected log-loss of
    pi* under p, uniform's), over `choices` ((gold_index, n_options) rows) at ``ratio = w / beta``
    (infinite without a KL term: pi* is all on the likeliest position).

    >>> rows = [(1, 4)] * 44 + [(2, 4)] * 20 + [(3, 4)] * 18 + [(4, 4)] * 18
    >>> [round(x, 3) for x in accuracy_optimum_log_loss(rows, 20.0)]
    [2.851, 1.386]
    >>> [round(x, 3) for x in accuracy_optimum_log_loss(rows, 10 / 3)]
    [1.301, 1.386]
    >>> accuracy_optimum_log_loss(rows, math.inf)[0]
    inf
    """
    from collections import Counter

    by_size = Counter(n for _, n in choices)
    seen = Counter(choices)
    total, optimum, uniform = len(choices), 0.0, 0.0
    for n, rows in by_size.items():
        p = [seen[(k, n)] / rows for k in range(1, n + 1)]
        if math.isinf(ratio):
            top = max(p)
            pi = [1.0 if x == top else 0.0 for x in p]
        else:
            pi = softmax([ratio * x for x in p])
        pi = [x / sum(pi) for x in pi]
        logs = [math.log(y) if y else -math.inf for y in pi]
        optimum -= rows / total * sum(x * y for x, y in zip(p, logs, strict=True) if x)
        uniform += rows / total * math.log(n)
    return optimum, uniform


# name -> a reward function, or a class whose instance is one (a reward that reads the policy:
# each trainer builds its own and binds its policy to it, grail.train.trainer)
REWARDS: dict[str, RewardFunc | type] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "opinion": opinion_reward,
    "log_score": LogScoreReward,
    "brier": BrierReward,
}


# a recipe without reward_funcs: the log score (proper: optimal at people's distribution) and
# the format that keeps replies parsable
DEFAULT_REWARDS = ["log_score", "format"]
REWARD_NOTES = {
    "log_score": "log q(choice) of the policy's option distribution after its thought "
    "(proper: optimal at q = people's distribution; the sampled answer never enters)",
    "brier": "the quadratic score of the same distribution (proper, bounded: optimal at q = p)",
    "accuracy": "1 when the sampled answer is the person's choice (mode-seeking: optimal with "
    "all mass on the likeliest option; kept for fidelity to upstream)",
    "format": "1 for <think>..</think><answer>N</answer> naming an option of the slate",
    "tag_count": "0.25 per think/answer tag that appears exactly once (format shaping)",
    "opinion": "1 when <opinion> matches the person's opinion change (optimal at its mode)",
}


def warn_mode_seeking(config, weights: list[float], train_dataset) -> str | None:
    """One line, logged, when the accuracy reward's KL-regularised optimum on the train split's
    position prior has a worse log-loss than uniform (:func:`accuracy_optimum_log_loss`): the
    recipe pays the simulator to collapse onto the likeliest option. Returns the line."""
    if "accuracy" not in config.reward_funcs:
        return None
    weight = weights[config.reward_funcs.index("accuracy")]
    if config.gail_use:
        weight *= 1 - config.gail_weight
    ratio = weight / config.beta if config.beta > 0 else math.inf
    choices = list(zip(train_dataset["gold_index"], train_dataset["n_options"], strict=True))
    optimum, uniform = accuracy_optimum_log_loss(choices, ratio)
    if optimum <= uniform:
        return None
    line = (
        f"reward_funcs: accuracy at weight {weight:.2f} with beta {config.beta:g} (w/beta = "
        f"{ratio:.3g}) is optimal at a log-loss of {optimum:.2f} on the train split's position "
        f"prior, worse than uniform's {uniform:.2f}: it pays the simulator to collapse onto the "
        "likeliest option; use log_score or brier (docs/training.md#objectives)"
    )
    logger.warning(line)
    return line
