"""Build a tiny Qwen2-architecture model and tokenizer offline (random weights, nothing downloaded).

Run: ``grail tiny-model --out models/tiny [--data data/] [--task causal-lm|classifier]``.

The tokenizer is a byte-level BPE trained on the dataset's prompts with Qwen2's own pre-tokenizer
(Split on Qwen's regex, isolated, then ByteLevel without its regex, NFC normalizer), so
``AutoTokenizer`` reloads it with the same token ids. It has Qwen's ChatML chat template, with
``<|im_end|>`` as eos and ``<|endoftext|>`` as pad. ``--task classifier`` builds the sequence
classifier (one logit: real vs policy choice) that the tiny GRAIL recipe uses as discriminator.
Each task gives its text and its format warm-up (:data:`grail.tasks.TASKS`: the dataset's
``audit.json`` names the task); without ``--data`` the text comes from a small slate study
simulated on the spot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grail.core.config import option
from grail.tasks import TASKS, recorded_task

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


def corpus(chats: list[list[dict[str, str]]], samples: list[str]) -> list[str]:
    """Texts to train the tokenizer on: every message, plus the task's reply `samples` (the
    slate task's answer and opinion tags; a study of documents has its own replies in every
    conversation)."""
    return [m["content"] for chat in chats for m in chat] + samples * 50


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
        "head size it has kernels for (the default 16 is refused, 64 works): --hidden-size 128 "
        "--heads 2 builds a model vLLM serves (make test-vllm).",
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
    warmup_prompt_weight: float = option(
        "The format warm-up also trains next-token prediction on the prompts' own text at "
        "this weight (the train split's prompts). 1.0 lets the cloned tiny policy learn the "
        "learnability ladder's marker rung (bench/learnability.py, docs/results.md); 0: the "
        "reply alone, as the demo's tiny-models task builds it.",
        0.0,
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
        if not 0 <= self.warmup_prompt_weight < float("inf"):
            raise ValueError(
                f"--warmup-prompt-weight {self.warmup_prompt_weight}: expected 0 or more"
            )
        if self.warmup_target not in ("uniform", "positions"):
            raise ValueError(f"--warmup-target {self.warmup_target!r}: use uniform or positions")
        task = recorded_task(self.data)
        if self.warmup_target not in TASKS[task].warmup_targets:
            raise ValueError(
                f"--warmup-target {self.warmup_target}: the {task} task's warm-up takes "
                + " or ".join(TASKS[task].warmup_targets)
            )
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
        # sampling by default, as Qwen2.5-Instruct's generation_config.json declares: a server
        # that builds its defaults from it (transformers serve) otherwise answers greedily
        # whatever temperature a request asks, and generate's n replies per prompt are one
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
        )
        if config.format_warmup:
            TASKS[recorded_task(config.data)].warm_up(
                model,
                tokenizer,
                chats,
                config.format_warmup,
                config.seed,
                config.data,
                config.warmup_target,
                prompt_weight=config.warmup_prompt_weight,
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

    task = TASKS[recorded_task(config.data)]
    needed = config.task == "causal-lm" and config.format_warmup
    chats = task.warmup_conversations(config.data) if needed or not config.tokenizer else []
    if config.tokenizer:
        return AutoTokenizer.from_pretrained(config.tokenizer), chats
    logger.info("training a %d-token tokenizer on %d conversations", config.vocab_size, len(chats))
    return train_tokenizer(corpus(chats, task.answer_samples), config.vocab_size), chats
