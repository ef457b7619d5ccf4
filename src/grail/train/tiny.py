"""Build a tiny Qwen2-architecture model and tokenizer offline (random weights, nothing downloaded).

Run: ``grail tiny-model --out models/tiny [--data data/] [--task causal-lm|classifier]``.

The tokenizer is a byte-level BPE trained on the dataset's prompts with Qwen2's own pre-tokenizer
(Split on Qwen's regex, isolated, then ByteLevel without its regex, NFC normalizer), so
``AutoTokenizer`` reloads it with the same token ids. It has Qwen's ChatML chat template, with
``<|im_end|>`` as eos and ``<|endoftext|>`` as pad. ``--task classifier`` builds the sequence
classifier (one logit: real vs policy choice) that the tiny GRAIL recipe uses as discriminator.
Without ``--data`` the text comes from a small synthetic study simulated on the spot.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grail.core.config import option
from grail.core.progress import Progress
from grail.core.prompts import option_token_ids

logger = logging.getLogger(__name__)

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
FORMAT_PREFIX = "<think></think><answer>"  # the warm-up's reply, up to the number (no thought)
FORMAT_SUFFIX = "</answer>"
ANSWER_SAMPLES = [f"{FORMAT_PREFIX}{k}{FORMAT_SUFFIX}" for k in range(1, 9)] + [
    f"<opinion>{d}</opinion>" for d in ("increase", "decrease", "no_change")
]


def holds_documents(data: str | Path | None) -> bool:
    """Whether `data` is a cleaned study of the summarize task (its audit says so)."""
    audit = Path(data) / "audit.json" if data else None
    return bool(
        audit and audit.is_file() and json.loads(audit.read_text()).get("task") == "summarize"
    )


def document_conversations(data: str | Path, limit: int = 3000) -> list[list[dict[str, str]]]:
    """The summarize task's prompts (extractive, the default budget), each with a reply that
    keeps a random 6 to 12 of its sentences: the format, and no preference for any sentence."""
    import numpy as np

    from grail.tasks.summarize.clean import read_documents
    from grail.tasks.summarize.prompt import BUDGETS, build_messages, extractive_reply

    rng = np.random.default_rng(0)
    chats = []
    for doc in read_documents(data, "train", limit):
        n = len(doc["sentences"])
        kept = sorted(rng.choice(n, min(n, int(rng.integers(6, 13))), replace=False).tolist())
        reply = {"role": "assistant", "content": extractive_reply(kept)}
        chats.append(
            build_messages(doc["sentences"], "extractive", BUDGETS["extractive"]) + [reply]
        )
    return chats


def conversations(data: str | Path | None, limit: int = 3000) -> list[list[dict[str, str]]]:
    """Prompt messages from a cleaned dataset, or from a small study simulated on the spot."""
    from grail.core.contract import read_dataset
    from grail.core.prompts import PromptOptions, build_messages

    if holds_documents(data):
        return document_conversations(data, limit)

    if data is None:
        from grail.clean.stage import clean
        from grail.study.simulate import simulate

        logger.info("no dataset given: simulating a 200-participant study for the text")
        with tempfile.TemporaryDirectory(prefix="grail-tiny-") as tmp:
            simulate(Path(tmp) / "raw", participants=200, seed=1)
            clean(Path(tmp) / "raw", Path(tmp) / "clean")
            return conversations(Path(tmp) / "clean", limit)
    rows = read_dataset(data).slice(0, limit).to_pylist()
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
    from grail.core.contract import read_dataset

    counts: dict[int, list[int]] = {}
    for row in read_dataset(data).slice(0, limit).to_pylist():
        sizes = counts.setdefault(row["n_options"], [1] * row["n_options"])
        sizes[row["gold_index"] - 1] += 1
    return {n: [c / sum(seen) for c in seen] for n, seen in counts.items()}


def corpus(chats: list[list[dict[str, str]]]) -> list[str]:
    """Texts to train the tokenizer on: every message, plus the answer and opinion tags (the
    slate task's; a study of documents has its own replies in every conversation)."""
    texts = [m["content"] for chat in chats for m in chat]
    return (
        texts
        if chats and chats[0][-1]["content"].startswith("<keep>")
        else texts + ANSWER_SAMPLES * 50
    )


def train_tokenizer(texts: list[str], vocab_size: int):
    """A Qwen2-style byte-level BPE tokenizer trained on `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def tiny_config(tokenizer, hidden_size: int, layers: int, heads: int = 4, **overrides):
    """A Qwen2 config sized for CPU tests (about 0.2M parameters at the defaults); `heads`
    query heads sharing half as many key/value heads."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **overrides,
    )


@dataclass(kw_only=True)
class TinyModelConfig:
    """grail tiny-model: a tiny Qwen2 model and its tokenizer, built offline."""

    out: str = option("Folder to write the model into.")
    data: str | None = option(
        "Cleaned dataset whose prompts train the tokenizer (default: a small simulated study); "
        "a study of documents (grail clean --task summarize) gives a summarizer.",
        None,
    )
    task: Literal["causal-lm", "classifier"] = option(
        "causal-lm (the policy) or classifier (the GRAIL discriminator).", "causal-lm"
    )
    hidden_size: int = option("Hidden size.", 64)
    heads: int = option(
        "Attention heads; the head size is hidden_size / heads. vLLM's CPU attention needs a "
        "head size it has kernels for (the default 16 is refused, 64 works): --hidden-size 256 "
        "--heads 4 builds a model vLLM serves (make test-vllm).",
        4,
    )
    layers: int = option("Transformer layers.", 2)
    vocab_size: int = option("BPE vocabulary size at most.", 2048)
    tokenizer: str | None = option(
        "A tiny model's folder whose tokenizer to reuse instead of training one (the GRAIL "
        "discriminator reads the policy's replies with the policy's tokens).",
        None,
    )
    seed: int = option("Weight initialisation seed.", 0)
    format_warmup: int = option(
        "Teacher-force the answer format for N steps, the option number trained toward the "
        "uniform distribution over the slate (no option favoured), so GRPO rewards vary on a "
        "tiny model; 0 keeps random weights.",
        0,
    )
    warmup_target: Literal["uniform", "positions"] = option(
        "What the warm-up trains the option number toward: uniform (position-neutral, the "
        "demo's start), or positions: how often people chose each display position in --data "
        "(a model with clear preferences, whose greedy answers do not hang on rounding).",
        "uniform",
    )

    def __post_init__(self):
        if self.task not in ("causal-lm", "classifier"):
            raise ValueError(f"unknown task {self.task!r}: use causal-lm or classifier")
        if self.warmup_target not in ("uniform", "positions"):
            raise ValueError(f"--warmup-target {self.warmup_target!r}: use uniform or positions")
        if self.warmup_target == "positions" and holds_documents(self.data):
            raise ValueError("--warmup-target positions: a study of documents has no positions")
        if self.warmup_target == "positions" and not self.data:
            raise ValueError("--warmup-target positions needs --data (people's choices)")
        if self.heads < 1 or self.hidden_size % self.heads or self.heads % 2 and self.heads > 1:
            raise ValueError(
                f"--heads {self.heads}: must divide --hidden-size {self.hidden_size} and be 1 or "
                "even (the key/value heads are half the query heads)"
            )


def build_tiny_model(out: str | Path, **options) -> Path:
    """Write a tiny model (random weights) and its tokenizer to `out`; returns `out`.
    `options`: the other :class:`TinyModelConfig` fields. `out` is written whole, and only if
    it is empty or an earlier tiny model (:func:`grail.core.outputs.atomic_folder`): never over
    a trained model's weights."""
    from grail.core.outputs import atomic_folder

    config = TinyModelConfig(out=str(out), **options)
    with atomic_folder(out, "tiny-model") as staging:
        _build(config, staging)
    return Path(out)


def _build(config: TinyModelConfig, out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    tokenizer, chats = tiny_tokenizer(config)
    torch.manual_seed(config.seed)
    if config.task == "causal-lm":
        model = Qwen2ForCausalLM(
            tiny_config(tokenizer, config.hidden_size, config.layers, config.heads)
        )
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        if config.format_warmup and holds_documents(config.data):
            teach_replies(model, tokenizer, chats, config.format_warmup, config.seed)
        elif config.format_warmup:
            targets = (
                position_frequencies(config.data) if config.warmup_target == "positions" else None
            )
            teach_format(
                model, tokenizer, chats, config.format_warmup, config.seed, targets=targets
            )
    else:
        model = Qwen2ForSequenceClassification(
            tiny_config(tokenizer, config.hidden_size, config.layers, config.heads, num_labels=1)
        )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    logger.info(
        "saved the %s model (%d parameters) to %s", config.task, model.num_parameters(), config.out
    )


def tiny_tokenizer(config: TinyModelConfig):
    """The tokenizer a tiny model gets (``config.tokenizer``'s, else one trained on the
    conversations) and the conversations, when the format warm-up needs them."""
    from transformers import AutoTokenizer

    needed = config.task == "causal-lm" and config.format_warmup
    chats = conversations(config.data) if needed or not config.tokenizer else []
    if config.tokenizer:
        return AutoTokenizer.from_pretrained(config.tokenizer), chats
    logger.info("training a %d-token tokenizer on %d conversations", config.vocab_size, len(chats))
    return train_tokenizer(corpus(chats), config.vocab_size), chats


def teach_format(
    model,
    tokenizer,
    chats: list[list[dict[str, str]]],
    steps: int,
    seed: int = 0,
    batch_size: int = 8,
    lr: float = 6e-3,
    targets: dict[int, list[float]] | None = None,
) -> list[float]:
    """Teacher-force the answer format for a few steps, so GRPO on a tiny model sees rewards vary.

    The loss covers the reply only: the tags and fixed thought as usual, and at the option
    number a cross-entropy against the uniform distribution over the slate's numbers (1..n), or
    ``targets[n]`` (n: the slate size): with the uniform target the model starts
    position-neutral. The rate decays to 0 and gradients are clipped, so sampled replies keep
    the format (docs/training.md, "Tiny model"). Returns the losses.
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
        replies, logits = reply_logits(model, ids, mask, labels, at)
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


def teach_replies(
    model, tokenizer, chats: list[list[dict[str, str]]], steps: int, seed: int = 0,
    batch_size: int = 8, lr: float = 6e-3,
) -> list[float]:  # fmt: skip
    """Teacher-force each conversation's reply (the loss on the reply only) for a few steps,
    with the rate decaying to 0: the summarize task's format warm-up, whose replies keep random
    sentences, so the model learns the format and no preference. Returns the losses."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer, schedule = warmup_optimizer(model, lr, steps)
    pad, losses = tokenizer.pad_token_id, []
    progress = Progress("format warm-up steps", steps)
    model.train()
    for _ in range(steps):
        picks = torch.randint(len(chats), (batch_size,), generator=generator).tolist()
        pairs = []
        for i in picks:
            text = tokenizer.apply_chat_template(
                chats[i][:-1], tokenize=False, add_generation_prompt=True
            )
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            reply = tokenizer(chats[i][-1]["content"] + "<|im_end|>", add_special_tokens=False)
            pairs.append((prompt, reply["input_ids"]))
        width = max(len(p) + len(r) for p, r in pairs)
        ids = [p + r + [pad] * (width - len(p) - len(r)) for p, r in pairs]
        labels = [[-100] * len(p) + r + [-100] * (width - len(p) - len(r)) for p, r in pairs]
        mask = [[1] * (len(p) + len(r)) + [0] * (width - len(p) - len(r)) for p, r in pairs]
        loss, _ = reply_logits(model, ids, mask, labels, [0] * len(pairs))
        losses.append(take_step(loss, model, optimizer, schedule))
        progress.update(len(losses), f"loss {losses[-1]:.3f}")
    model.eval()
    return losses


def warmup_optimizer(model, lr: float, steps: int):
    """AdamW at `lr`, decaying linearly to 0 over `steps`: a warm-up that ends gently."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)


def take_step(loss, model, optimizer, schedule) -> float:
    """One warm-up step with the gradient norm clipped to 1; returns the loss."""
    import torch

    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    return loss.item()


def reply_logits(model, ids, mask, labels, at):
    """The causal LM's loss on the labelled tokens (mean cross-entropy of each next token, as
    ``model(labels=...)`` computes it) and its logits at the positions `at`, with the LM head
    applied at those positions alone: a prompt is ~20 times longer than its reply, and the
    head over every prompt position made a warm-up step half as long again."""
    import torch

    hidden = model.model(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)
    ).last_hidden_state
    following = torch.tensor(labels)[:, 1:]  # the token each position predicts
    scored = following != -100
    replies = torch.nn.functional.cross_entropy(
        model.lm_head(hidden[:, :-1][scored]), following[scored]
    )
    return replies, model.lm_head(hidden[torch.arange(len(at)), torch.tensor(at)])


def _options_in_prompt(chat: list[dict[str, str]]) -> int:
    """The number of OPTIONS lines in a conversation's user prompt."""
    options = chat[-2]["content"].rsplit("OPTIONS\n", 1)[-1]
    return len(options.splitlines())
