"""The SFT warm start: with ``sft_dataset``, TRL's ``SFTTrainer`` fine-tunes the model on the
replies of a ``grail generate`` output, or, given ``choices``, clones the train split's own
choices by maximum likelihood (:class:`BehaviourCloningTrainer`: the person's option over the
slate at weight 1, the reply's format at ``sft_format_weight``; a learning-rate warm-up; epochs
stopped early on held-out participants), before GRPO starts from it. The model goes to
``output_dir/sft`` (a LoRA adapter merged into full weights) with its own ``metrics.json`` (and
``cloning.json`` for cloning), and its phase to a nested MLflow run.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from transformers import TrainerCallback
from trl import SFTTrainer

from grail.core import tracking
from grail.core.errors import GrailError
from grail.core.outputs import replace_text
from grail.core.padding import causal_attention_mask
from grail.core.rewards import completion_text
from grail.tasks import TASKS
from grail.train.config import ModelConfig, TrainConfig
from grail.train.examples import prompt_record
from grail.train.logs import MetricsCallback, StopOnNonFinite, check_finite_weights, quiet_logs
from grail.train.overrides import ExtraSignatureColumns, logged_metrics
from grail.train.trainer import model_init_kwargs

logger = logging.getLogger(__name__)


def sft_warm_start(config: TrainConfig, model_config: ModelConfig) -> str:
    """Fine-tune on ``sft_dataset`` with TRL's SFTTrainer (loss on the replies only), or, given
    ``choices``, clone the train split's choices by maximum likelihood
    (:class:`BehaviourCloningTrainer`, stopped early on held-out participants); returns the
    fine-tuned model's folder.

    The model is saved with ``trainer.save_model``, which gathers ZeRO-3's partitioned weights
    and writes on the main process only.
    """
    from trl import get_peft_config

    from grail.train.multigpu import Nodes

    if Nodes.from_environment().count > 1 and not config.checkpoint_uri:
        raise GrailError(
            "sft_dataset on several nodes needs checkpoint_uri: the warm start's model reaches "
            "the other nodes through it"
        )
    cloning = config.sft_dataset == BEHAVIOUR_CLONING
    out = Path(config.output_dir) / "sft"
    thought_stats = None
    if cloning:
        examples, held_out, thought_stats = choice_examples(config, model_config, out)
    else:
        examples, held_out = sft_examples(config.sft_dataset), None
    tokenizer = None
    if cloning and config.sft_thoughts != "empty":
        tokenizer = thinking_tokenizer(model_config.model_name_or_path)
    args = sft_config(config, model_config, out, len(examples), held_out is not None)
    # the start model's files are hashed once, where it is read: not in every process of a run
    identity = cache(lambda: cloning_identity(config, model_config, args, examples, held_out))
    if adopted(config, identity, out):
        return str(out)
    metrics = MetricsCallback()
    best = KeepBest(out, config.sft_early_stopping_patience) if held_out is not None else None
    callbacks = [StopOnNonFinite(), metrics] + ([] if best is None else [best])
    trainer_class = BehaviourCloningTrainer if cloning else SFTTrainer
    trainer = trainer_class(
        model=model_config.model_name_or_path,
        args=args,
        train_dataset=examples,
        eval_dataset=held_out,
        callbacks=callbacks,
        peft_config=get_peft_config(model_config),
        # with thoughts, the tokenizer whose generation prompt opens the thought: saved with
        # the model, so GRPO, vLLM and the benchmark start inside it (prefill_thought)
        **({"processing_class": tokenizer} if tokenizer is not None else {}),
        **(cloning_weights(config) if cloning else {}),
    )
    if best is not None:
        best.trainer = trainer
    quiet_logs(trainer)
    with mlflow_phase("sft", "mlflow" in (config.report_to or [])):
        trainer.train()
    if best is None or best.step is None:
        check_finite_weights(trainer.model, "the SFT warm start")
        trainer.save_model(str(out))  # a collective under ZeRO-3: every process calls it
    if trainer.is_world_process_zero():
        if model_config.use_peft:
            merge_adapter(out)
        metrics.write(out)
        if best is not None:
            best.write(out, trainer.state, len(examples), len(held_out), thought_stats)
        if cloning:  # asked as it was trained, when the benchmark scores it alone
            replace_text(out / "prompt.json", json.dumps(prompt_record(config), indent=1) + "\n")
        made = identity() | {"files": warm_start_files(out)}  # what sft_reuse checks
        replace_text(out / MADE_FROM, json.dumps(made, indent=1, sort_keys=True) + "\n")
    trainer.accelerator.wait_for_everyone()
    share_across_nodes(out, config.checkpoint_uri, trainer)
    logger.info(
        "SFT warm-start: %d steps on %d conversations -> %s",
        trainer.state.global_step,
        len(examples),
        out,
    )
    end_phase(trainer)
    return str(out)


def cloning_weights(config: TrainConfig) -> dict:
    """What cloning weighs beside the person's choice: the reply's format and the line scores."""
    return {
        "format_weight": config.sft_format_weight,
        "option_score_weight": config.sft_option_score_weight,
    }


BEHAVIOUR_CLONING = "choices"  # sft_dataset: the train split's own choices
MADE_FROM = "made_from.json"  # what made a warm start: its settings, examples and start model
# SFTConfig fields that name places or say how training reports, never what it learns
NOT_LEARNED = ("output_dir", "logging_dir", "run_name", "report_to", "logging_steps",
               "disable_tqdm", "accelerator_config", "local_rank")  # fmt: skip


def cloning_identity(config: TrainConfig, model_config: ModelConfig, args, examples,
                     held_out) -> dict:  # fmt: skip
    """What a warm start learns from, to tell whether another run's can stand for this one's
    (``sft_reuse``): TRL's SFTConfig but for where it writes and how it reports, the settings
    passed beside it (the format's weight, early stopping, the thoughts, LoRA), the SHA-256 of
    its examples and held-out rows, and of every file of the start model (its name where it
    is no folder)."""
    import hashlib
    from dataclasses import asdict

    def digest(value) -> str:
        text = json.dumps(value, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    settings = {k: v for k, v in args.to_dict().items() if k not in NOT_LEARNED}
    start = Path(model_config.model_name_or_path).expanduser()
    if start.is_dir():
        files = {}
        for path in sorted(p for p in start.rglob("*") if p.is_file()):
            files[str(path.relative_to(start))] = hashlib.sha256(path.read_bytes()).hexdigest()
        model = digest(files)
    else:
        model = model_config.model_name_or_path
    lora = {k: v for k, v in asdict(model_config).items() if k != "model_name_or_path"}
    return {
        "sft": digest(settings),
        "beside": digest(
            {
                "format_weight": config.sft_format_weight,
                "patience": config.sft_early_stopping_patience,
                "thoughts": config.sft_thoughts,
                "model_config": lora,
                **(
                    {"option_scores": config.sft_option_score_weight}
                    if config.sft_option_score_weight
                    else {}
                ),
            }
        ),
        "examples": digest([examples.to_list(), held_out.to_list() if held_out else None]),
        "start_model": model,
    }


def adopted(config: TrainConfig, identity, out: Path) -> bool:
    """Whether ``sft_reuse``'s warm start stands for this run's (`identity`, which makes
    :func:`cloning_identity` when first called, equal): then copied into `out`, and the run
    clones nothing. Otherwise, or in a run of several processes, False, with one line saying
    why."""
    import shutil

    if not config.sft_reuse:
        return False
    given = Path(config.sft_reuse) / MADE_FROM
    if config.world_size > 1:
        logger.info("sft_reuse: a run of %d processes clones anew", config.world_size)
        return False
    recorded = json.loads(given.read_text()) if given.is_file() else None
    files = recorded.pop("files", None) if isinstance(recorded, dict) else None
    ours = identity()
    if recorded != ours:
        differs = sorted(k for k in ours if (recorded or {}).get(k) != ours[k])
        logger.info("sft_reuse: %s not adopted (its %s differ): cloning", given.parent,
                    ", ".join(differs))  # fmt: skip
        return False
    if not isinstance(files, dict) or warm_start_files(given.parent) != files:
        logger.info("sft_reuse: %s not adopted (its files are not those it was made with: "
                    "changed since, or not recorded): cloning", given.parent)  # fmt: skip
        return False
    shutil.copytree(given.parent, out, dirs_exist_ok=True)
    logger.info("SFT warm start adopted from %s: the same settings, examples and start model",
                given.parent)  # fmt: skip
    return True


def warm_start_files(folder: Path) -> dict[str, str]:
    """Every file of a warm start but its :data:`MADE_FROM` record, by its sha256: what
    ``sft_reuse`` adopts only while unchanged (a flipped byte in its weights clones anew)."""
    from grail.core.outputs import CLAIM, LEFTOVER, MARKER, sha256

    records = (MADE_FROM, MARKER, CLAIM, LEFTOVER)  # what commands write about a folder
    return {
        path.relative_to(folder).as_posix(): sha256(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name not in records
    }


def share_across_nodes(out: Path, checkpoint_uri: str | None, trainer) -> None:
    """On a TrainJob of several nodes, each with its own disk, the warm start's model (written
    by the main process alone: ZeRO-3 gathers the weights there) reaches every node through
    ``checkpoint_uri/sft``: uploaded by the main process, downloaded by each other node's
    first process, before any process loads it for RL."""
    from grail.core.storage import Location, download_folder, upload_folder
    from grail.train.multigpu import Nodes

    nodes = Nodes.from_environment()
    if nodes.count < 2:
        return
    where = Location.parse(checkpoint_uri).child("sft")
    if trainer.is_world_process_zero():
        upload_folder(out, where)
    trainer.accelerator.wait_for_everyone()
    if nodes.rank != 0 and trainer.is_local_process_zero():
        download_folder(where, out)
    trainer.accelerator.wait_for_everyone()


def sft_config(config: TrainConfig, model_config: ModelConfig, out: Path, rows: int, stops: bool):
    """TRL's ``SFTConfig`` for the warm start; with `stops` (held-out participants to evaluate
    on), evaluated and saved at the same moments and the best model kept (early stopping)."""
    from trl import SFTConfig

    from grail.train.multigpu import configured_state

    every = {"eval_strategy": "no"}
    if stops:  # evaluated on the held-out participants; KeepBest saves and stops
        strategy = "steps" if config.sft_eval_steps else "epoch"
        every = {
            "eval_strategy": strategy,
            "eval_steps": config.sft_eval_steps or None,
            "per_device_eval_batch_size": config.sft_batch_size
            or config.per_device_train_batch_size,
        }
    return SFTConfig(
        output_dir=str(out),
        num_train_epochs=config.sft_num_train_epochs,
        max_steps=config.sft_max_steps,
        learning_rate=config.sft_learning_rate,
        warmup_steps=config.sft_warmup_ratio,  # a float below 1: a share of the steps
        max_length=config.sft_max_length,
        completion_only_loss=True,
        gradient_checkpointing=config.gradient_checkpointing,  # the recipe's (or the memory
        # estimate's, grail.train.memory): TRL's SFTConfig would default it on
        per_device_train_batch_size=min(
            config.sft_batch_size or config.per_device_train_batch_size, rows
        ),
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        logging_steps=config.logging_steps,
        report_to=config.report_to,
        use_cpu=config.use_cpu,
        bf16=config.bf16,
        seed=config.seed,
        disable_tqdm=config.disable_tqdm,
        accelerator_config=configured_state(),
        model_init_kwargs={
            k: v for k, v in model_init_kwargs(config, model_config).items() if v is not None
        },
        save_strategy="no",  # the best model is saved by KeepBest, not as checkpoints
        **every,
    )


class BehaviourCloningTrainer(ExtraSignatureColumns, SFTTrainer):
    """TRL's SFTTrainer with behaviour cloning's loss (:func:`cloning_loss`): maximum
    likelihood of the person's choice over the slate's option numbers (the distribution the
    benchmark reads), plus the reply's format at `format_weight` (its other tokens, and an
    option number of the slate at the choice's position). In evaluation the choice
    term alone: the held-out choice log-loss that early stopping watches (``eval_loss``).

    Each example's slate size (``n_options``) travels with its batch (:class:`WithSlateSizes`).
    """

    extra_columns = ("n_options",)  # each example's slate size, for the loss

    def __init__(
        self, *args, format_weight: float = 0.1, option_score_weight: float = 0.0, **kwargs
    ):
        from grail.inference.answers import option_token_ids

        super().__init__(*args, **kwargs)
        self.format_weight = format_weight
        self.option_score_weight = option_score_weight
        self.option_tokens = option_token_ids(self.processing_class, MAX_OPTIONS)
        lines = OptionLines(self.processing_class) if option_score_weight else None
        self.data_collator = WithSlateSizes(self.data_collator, lines)
        # the loss is a mean over one micro-batch's choices: Trainer divides it by the
        # accumulation steps itself (transformers' Trainer.training_step)
        self.model_accepts_loss_kwargs = False

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        sizes = inputs.pop("n_options")
        ends = inputs.pop("option_ends", None)
        targets = inputs["labels"][:, 1:]  # position t predicts token t + 1
        # the logits of the positions that predict a reply token in some row, not all ~500
        kept = (targets != -100).any(0).nonzero().squeeze(1)
        scored = ends is not None and model.training
        # and where option lines end, for their scores
        keep = torch.cat([kept, ends[ends >= 0]]).unique() if scored else kept
        # TRL's collator pads on the right: causal attention alone, without the L x L mask
        outputs = model(
            input_ids=inputs["input_ids"],
            attention_mask=causal_attention_mask(inputs["attention_mask"]),
            logits_to_keep=keep,
            use_cache=False,
        )
        logits = outputs.logits.float()
        at = torch.searchsorted(keep, kept)  # the reply's positions among those kept
        targets = targets[:, kept]
        numbers = torch.tensor(self.option_tokens, device=targets.device)
        # the chat template's text after the end-of-turn token (ChatML's "\n") is never
        # generated: outside the loss (a token the model never saw, ~10 nats, would outweigh
        # the choice)
        end = targets == self.processing_class.eos_token_id
        reply = (targets != -100) & (end.cumsum(1) - end.long() == 0)
        weight = self.format_weight if model.training else 0.0
        loss, choice = cloning_loss(logits[:, at], targets, reply, numbers, sizes, weight)
        if scored:
            lines = torch.searchsorted(keep, ends.clamp(min=0))
            scores = logits[:, :, self.processing_class.eos_token_id].gather(1, lines)
            options = option_score_loss(scores, ends >= 0, chosen_option(targets, reply, numbers))
            loss = loss + self.option_score_weight * options
            logged_metrics(self, "train")["option_score_nll"].append(
                self.accelerator.gather_for_metrics(options.detach()).mean().item()
            )
        mode = "train" if model.training else "eval"
        logged_metrics(self, mode)["choice_nll"].append(
            self.accelerator.gather_for_metrics(choice.detach()).mean().item()
        )
        return (loss, outputs) if return_outputs else loss


class WithSlateSizes:
    """A collator that adds each example's ``n_options`` to the batch TRL's collator builds,
    and with `lines` (:class:`OptionLines`) where each option's line ends (``option_ends``:
    rows x MAX_OPTIONS token positions, -1 past the slate)."""

    def __init__(self, collator, lines=None):
        self.collator = collator
        self.lines = lines

    def __call__(self, examples: list[dict]) -> dict:
        import torch

        batch = self.collator(examples)
        batch["n_options"] = torch.tensor([e["n_options"] for e in examples])
        if self.lines is not None:
            ends = [self.lines(e["input_ids"], e["n_options"]) for e in examples]
            batch["option_ends"] = torch.tensor(
                [row + [-1] * (MAX_OPTIONS - len(row)) for row in ends]
            )
        return batch


class OptionLines:
    """Where each option's line ends in a tokenized chat (:func:`option_line_ends` on its
    tokens' text, each token decoded once)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text: dict[int, str] = {}

    def __call__(self, ids: list[int], options: int) -> list[int]:
        for token in set(ids) - self.text.keys():
            self.text[token] = self.tokenizer.decode([token])
        return option_line_ends([self.text[t] for t in ids], options)


def option_line_ends(pieces: list[str], options: int) -> list[int]:
    """The position of each option line's last token (before its line break; the last
    line's, before the end of the user's turn) after the prompt's last ``OPTIONS`` header,
    given each token's text: every line ends alike (its comment count), so the scores
    start alike. A slate the prompt does not show whole is an error.

    >>> pieces = ["VIEW", "ER\\n", "OPTIONS", "\\n", "1", ". a", "\\n", "2", ". b", "<|im_end|>"]
    >>> option_line_ends(pieces, 2)
    [5, 8]
    """
    starts, length = [], 0
    for piece in pieces:
        starts.append(length)
        length += len(piece)
    header = "".join(pieces).rfind("OPTIONS\n")
    if header < 0:
        raise GrailError("option scores: no OPTIONS header in a cloned prompt")
    after = next(i for i, s in enumerate(starts) if s + len(pieces[i]) > header + len("OPTIONS"))
    breaks = [i for i in range(after + 1, len(pieces)) if "\n" in pieces[i]]
    close = [i for i in range(after + 1, len(pieces)) if pieces[i] == "<|im_end|>"]
    if len(breaks) < options - 1 or not close or (options > 1 and breaks[options - 2] > close[0]):
        raise GrailError(f"option scores: the prompt does not show its {options} options whole")
    return [i - 1 for i in breaks[: options - 1] + close[:1]]


def chosen_option(targets, reply, numbers):
    """Each row's chosen option, 0-based: the reply's last option number (as
    :func:`cloning_loss` reads it)."""
    import torch

    numeric = torch.isin(targets, numbers) & reply
    order = torch.arange(1, targets.shape[1] + 1, device=targets.device)
    last = targets.gather(1, (numeric * order).argmax(1, keepdim=True))
    return (numbers.unsqueeze(0) == last).float().argmax(1)


def option_score_loss(scores, shown, chosen):
    """Mean over rows of -log softmax(scores over the options shown)[chosen]: the option
    scores' cross-entropy against the person's choice (a proper scoring rule over the
    slate, as the answer's).

    >>> import torch
    >>> scores = torch.tensor([[0.0, 0.0, 9.0]])  # a 2-option slate: the third is padding
    >>> round(option_score_loss(scores, torch.tensor([[True, True, False]]),
    ...                         torch.tensor([1])).item(), 4)
    0.6931
    """
    import torch

    masked = scores.masked_fill(~shown, float("-inf"))
    return torch.nn.functional.cross_entropy(masked, chosen)


MAX_OPTIONS = 9  # option numbers a slate can show as one token each (the studies show at most 8)


def cloning_loss(logits, targets, reply, numbers, sizes, format_weight: float):
    """Behaviour cloning's loss on a batch of replies; returns (loss, choice log-loss).

    The choice term: -log q(choice), q the softmax of the option-number tokens' logits over
    each row's slate (1..n_options) at the position that predicts the option token (the
    reply's last option number: a scored thought may write numbers of its own). The format
    term, times `format_weight`: every other reply token's negative log-likelihood over the
    whole vocabulary, and at the option's position -log P(an option number), the mass on the
    numbers 1..9 as a set: it keeps the answer a number without saying which. The option
    token's own likelihood over the vocabulary would teach each number's share over all
    slates ("5" is chosen in 1% of the rows, most slates having 4 options, but in 11% of the
    5-option ones), and so would the mass on the slate's numbers alone (a 4-option row's "5"
    pushed down as off the slate). Both over the number of choices (one per reply).

    `logits` (rows, positions, vocabulary), `targets` (rows, positions: the token each
    position predicts, -100 outside the reply), `reply` (rows, positions: True where the reply
    is scored), `numbers` (the tokens of option numbers 1..9), `sizes` (rows).

    >>> import torch
    >>> logits = torch.zeros(1, 2, 5)  # vocabulary: 0 '<', 1 '>', 2 '1', 3 '2', 4 '3'
    >>> targets, reply = torch.tensor([[0, 3]]), torch.tensor([[True, True]])
    >>> loss, choice = cloning_loss(logits, targets, reply, torch.tensor([2, 3, 4]),
    ...                             torch.tensor([2]), 0.0)
    >>> round(choice.item(), 4), round(loss.item(), 4)  # log 2: two options, equally likely
    (0.6931, 0.6931)
    >>> round(cloning_loss(logits, targets, reply, torch.tensor([2, 3, 4]), torch.tensor([2]),
    ...                    0.5)[0].item(), 4)  # + 0.5 * (log 5 - log 3/5): '<', then a number
    1.7533
    >>> targets, logits = torch.tensor([[2, 3]]), torch.zeros(1, 2, 5)  # a thought's '1', then
    >>> logits[0, 1, 3] = 2.0  # the answer '2', which the model puts at odds e^2 against '1'
    >>> round(cloning_loss(logits, targets, reply, torch.tensor([2, 3, 4]), torch.tensor([2]),
    ...                    0.0)[1].item(), 4)  # one choice, the last number: log(1 + e^-2)
    0.1269
    """
    import torch

    numeric = torch.isin(targets, numbers) & reply
    # the choice is the reply's last number (a scored thought may hold numbers of its own)
    order = torch.arange(1, targets.shape[1] + 1, device=targets.device)
    last = (numeric * order).argmax(1)
    is_choice = torch.zeros_like(numeric)
    is_choice[numeric.any(1).nonzero(as_tuple=True)[0], last[numeric.any(1)]] = True
    rows, positions = is_choice.nonzero(as_tuple=True)
    option_logits = logits[rows, positions][:, numbers]
    slate = torch.arange(len(numbers), device=logits.device) < sizes[rows].unsqueeze(1)
    option_logits = option_logits.masked_fill(~slate, float("-inf"))
    chosen = (numbers.unsqueeze(0) == targets[rows, positions].unsqueeze(1)).float().argmax(1)
    choice_nll = torch.nn.functional.cross_entropy(option_logits, chosen, reduction="sum")
    count = is_choice.sum().clamp(min=1)
    loss = choice_nll / count
    if format_weight > 0:
        other = reply & ~is_choice
        safe = targets.masked_fill(~other, 0)
        token_nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), safe, reduction="none"
        )
        at_choice = logits[rows, positions]
        some_number = at_choice.logsumexp(-1) - at_choice[:, numbers].logsumexp(-1)
        format_nll = (token_nll * other).sum() + some_number.sum()
        loss = loss + format_weight * format_nll / count
    return loss, choice_nll.detach() / count


def choice_examples(
    config: TrainConfig, model_config: ModelConfig | None = None, out: Path | None = None
):
    """Behaviour cloning's examples: each train prompt (as GRPO sees it) with the reply that
    picks the option the person chose and, with the opinion task, states their opinion's
    direction (the task's ``cloning_examples``); and the rows of the held-out participants
    (``sft_holdout_fraction``, seeded), evaluated and never trained on (None without a
    hold-out); and what the replies' thoughts are (:func:`clone_thoughts`; None with
    ``sft_thoughts: empty``).

    With thoughts, an example is the chat's text up to and including its closed thought, then
    the answer: TRL's completion-only loss never reaches the thought's tokens, nor where the
    thought ends."""
    from datasets import Dataset

    from grail.train.examples import dataset_folder

    cloning = TASKS[config.task].cloning_examples
    if cloning is None:
        raise GrailError(f"sft_dataset: choices: the {config.task} task has no choices to clone")
    folder = dataset_folder(config)
    rows, made = cloning(config, folder, config.train_split, config.sft_max_train_rows)
    held = held_out_participants(
        [r["participant_id"] for r in rows], config.sft_holdout_fraction, config.seed
    )
    thoughts, stats, chat = clone_thoughts(
        config, model_config, rows, made, out or Path(config.output_dir) / "sft"
    )

    def example(e, thought):
        if thought is None:
            return {
                "prompt": e["prompt"],
                "completion": [{"role": "assistant", "content": e["reply"]}],
                "n_options": e["n_options"],
            }
        _, answer = e["reply"].split(THINK_END, 1)
        if config.sft_thought_loss:  # the thought, its end and the answer all scored
            return {
                "prompt": chat(e["prompt"]),
                "completion": thought + "\n" + THINK_END + "\n" + answer,
                "n_options": e["n_options"],
            }
        return {
            # the thought closed in the prompt: when to stop thinking is the thought's, never
            # the loss's (SmolLM2 cloned with the loss on </think> closed every thought after
            # 1 to 3 tokens). Line breaks around </think>: without them ">" merges with the
            # next "<" into one token across the prompt's end, and TRL trains on a cut context
            "prompt": chat(e["prompt"]) + thought + "\n" + THINK_END + "\n",
            "completion": answer,
            "n_options": e["n_options"],
        }

    train, evaluate = [], []
    for row, e, thought in zip(rows, made, thoughts, strict=True):
        (evaluate if row["participant_id"] in held else train).append(example(e, thought))
    return (
        Dataset.from_list(train),
        Dataset.from_list(evaluate) if evaluate else None,
        stats,
    )


THINK_START, THINK_END = "<think>", "</think>"
PREFILL = "{% if add_generation_prompt %}" + THINK_START + "{% endif %}"


def thinking_tokenizer(model: str):
    """The start model's tokenizer with :func:`prefill_thought`'s chat template."""
    from transformers import AutoTokenizer

    return prefill_thought(AutoTokenizer.from_pretrained(model))


def prefill_thought(tokenizer):
    """`tokenizer` with a chat template whose generation prompt opens the thought (ends with
    ``<think>``), as DeepSeek-R1's does: a model cloned on replies that keep a thought never
    learns to open one (the loss is on the answer alone), so the prompt opens
    it. Saved with the cloned model, it reaches every reader of it: TRL's GRPO, vLLM, the
    benchmark and the rewards all start inside the thought. A template that already opens one
    is kept as it is.
    """
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise GrailError(
            f"{tokenizer.name_or_path}: a model that keeps thoughts needs one chat template "
            f"(found {type(template).__name__}) whose generation prompt can open <think>"
        )
    chat = [{"role": "user", "content": "x"}]
    opened = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    if not opened.rstrip().endswith(THINK_START):
        tokenizer.chat_template = template + PREFILL
    return tokenizer


def clone_thoughts(config: TrainConfig, model_config: ModelConfig, rows, examples, out: Path):
    """The thought each cloned reply keeps (``sft_thoughts``), what they are, and the chat
    template that turns a prompt into text: ``empty`` keeps none (every thought ``None``:
    ``<think></think>``); ``own`` samples one per row from the start model
    (:func:`own_thoughts`); ``teacher`` takes it from a ``grail generate`` output
    (:func:`teacher_thoughts`). Returns (thoughts, {share non-empty, mean characters, ...} or
    None, chat)."""
    if config.sft_thoughts == "empty":
        return [None] * len(rows), None, None
    tokenizer = thinking_tokenizer(model_config.model_name_or_path)

    def chat(prompt) -> str:  # ends with <think>: the thought follows
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    budget = thought_budget(config, tokenizer)

    def kept(thought):
        return fitted(first_sentences(thought, config.sft_thought_sentences), tokenizer, budget)

    if config.sft_thoughts == "teacher":
        thoughts = [kept(t) for t in teacher_thoughts(config.sft_teacher, rows)]
    else:
        thoughts = shared_own_thoughts(
            config, model_config, tokenizer, [chat(e["prompt"]) for e in examples]
        )
        thoughts = [kept(t) for t in thoughts]
        if config.process_index == 0:
            out.mkdir(parents=True, exist_ok=True)
            replace_text(out / "thoughts.json", json.dumps(thoughts))
    written = [t for t in thoughts if t]
    stats = {
        "source": config.sft_thoughts,
        "scored": config.sft_thought_loss,
        "rows": len(thoughts),
        "non_empty_share": round(len(written) / len(thoughts), 4) if thoughts else 0.0,
        "mean_characters": round(sum(map(len, written)) / len(written), 1) if written else 0.0,
    }
    logger.info(
        "behaviour cloning keeps %s thoughts: %.0f%% of %d replies have one, %.0f characters "
        "on average (%s)",
        config.sft_thoughts,
        100 * stats["non_empty_share"],
        stats["rows"],
        stats["mean_characters"],
        "scored as the format" if config.sft_thought_loss else "no loss on them",
    )
    return thoughts, stats, chat


def thought_budget(config: TrainConfig, tokenizer) -> int:
    """The tokens a cloned thought may take: ``max_completion_length`` less what follows it
    (``\n</think>\n<answer>NN</answer>``, the opinion tag with the opinion task, the end of
    turn).
    A cloned reply longer than RL's completions would teach a thought RL's completions cannot
    hold, cut before its answer."""
    closing = TASKS[config.task].cloning_answer(config)
    after = "\n" + THINK_END + "\n" + closing  # as choice_examples closes a cloned thought
    room = len(tokenizer(after, add_special_tokens=False)["input_ids"]) + 1
    return max(config.max_completion_length - room, 1)


def fitted(thought: str | None, tokenizer, budget: int) -> str | None:
    """`thought` cut to `budget` tokens (at the last whitespace inside them, so no word is
    halved), stripped; None stays None."""
    if not thought:
        return thought
    ids = tokenizer(thought, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return thought
    text = tokenizer.decode(ids[:budget], skip_special_tokens=True)
    rest = tokenizer.decode(ids[budget:], skip_special_tokens=True)
    halved = not rest[:1].isspace() and not text[-1:].isspace() and len(text.split()) > 1
    return (text.rsplit(None, 1)[0] if halved else text).strip()


def first_sentences(thought: str | None, count: int | None) -> str | None:
    r"""`thought`'s first `count` sentences (one ends at ``.``, ``!`` or ``?`` before a space,
    or at a line break), stripped; `count` None keeps it whole.

    >>> first_sentences("Pro-gun viewer. Picks 2.\nOPTIONS:", 1)
    'Pro-gun viewer.'
    >>> first_sentences("A 3.5 hour talk! Then news", 2), first_sentences("OPTIONS:\n1. a", 1)
    ('A 3.5 hour talk! Then news', 'OPTIONS:')
    >>> first_sentences("  ", 1), first_sentences(None, 1), first_sentences("a. b", None)
    ('', None, 'a. b')
    """
    import re

    if not thought or count is None:
        return thought
    pieces = re.split(r"(?<=[.!?])[ \t]+|\s*\n\s*", thought.strip())
    return " ".join(p for p in pieces[:count] if p).strip()


def thought_of(text: str) -> str:
    """The thought a sampled continuation of ``...<think>`` wrote: up to ``</think>`` (or an
    ``<answer>`` it opened without closing the thought), stripped.

    >>> thought_of(" pro-gun viewer </think><answer>2</answer>"), thought_of("a<answer>1")
    ('pro-gun viewer', 'a')
    >>> thought_of("<think>a teacher's whole reply</think><answer>3</answer>")
    "a teacher's whole reply"
    """
    text = text.split(THINK_START, 1)[-1]
    return text.split(THINK_END, 1)[0].split("<answer>", 1)[0].strip()


def shared_own_thoughts(config: TrainConfig, model_config: ModelConfig, tokenizer, texts):
    """:func:`own_thoughts` split over every process (rank r samples texts r, r + world, ...;
    minutes of sampling on one process would outlast the others' wait at a barrier), gathered
    back into the texts' order on every process."""
    from accelerate import PartialState

    state = PartialState()
    mine = list(range(state.process_index, len(texts), state.num_processes))
    sampled = own_thoughts(
        config,
        model_config,
        tokenizer,
        [texts[k] for k in mine],
        seed=config.seed + state.process_index,
    )
    pairs = list(zip(mine, sampled, strict=True))
    if state.num_processes > 1:
        from accelerate.utils import gather_object

        pairs = gather_object(pairs)
    return [thought for _, thought in sorted(pairs)]


def own_thoughts(
    config: TrainConfig, model_config: ModelConfig, tokenizer, texts, seed: int = 0
) -> list[str]:
    """One thought per text (a chat ending in ``<think>``), sampled from the start model at the
    recipe's temperature, at most :func:`thought_budget` tokens (the cloned reply then fits
    RL's ``max_completion_length``), seeded. An empty thought is drawn again (at most
    ``THOUGHT_REDRAWS`` times): a recipe that keeps thoughts clones a model that thinks, and
    the thoughts it keeps are still ones the model writes (SmolLM2 wrote none in 28% of its
    first draws, which would teach it to close the thought at once as often)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grail.train.overrides import outside_zero3
    from grail.train.sampling import sample_replies

    kwargs = {k: v for k, v in model_init_kwargs(config, model_config).items() if v is not None}
    with outside_zero3():  # sampled whole on the main process, before any engine exists
        model = AutoModelForCausalLM.from_pretrained(model_config.model_name_or_path, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(seed)
    model = model.to(config.device)  # this process's device (TrainingArguments')
    thoughts: list[str] = [""] * len(texts)
    empty = list(range(len(texts)))
    for draw in range(1 + THOUGHT_REDRAWS):
        replies = sample_replies(
            model,
            tokenizer,
            [texts[k] for k in empty],
            thought_budget(config, tokenizer),
            config.temperature,
            config.per_device_train_batch_size,
            "own thoughts sampled for cloning" + (f" (redraw {draw})" if draw else ""),
        )
        for k, reply in zip(empty, replies, strict=True):
            thoughts[k] = thought_of(reply)
        empty = [k for k in empty if not thoughts[k]]
        if draw == 0:
            logger.info("own thoughts: %d of %d first draws are empty", len(empty), len(texts))
        if not empty:
            break
    del model
    return thoughts


THOUGHT_REDRAWS = 2  # an empty own thought is drawn again, at most this many times


def teacher_thoughts(generated: str, rows: list[dict]) -> list[str]:
    """Each row's thought from a ``grail generate`` output (``generated.parquet``, matched by
    session and step): the first reply that picked the person's choice, else the first reply;
    a row the teacher never answered keeps an empty thought (counted in the stats)."""
    import pyarrow.parquet as pq

    path = Path(generated)
    path = path / "generated.parquet" if path.is_dir() else path
    if not path.is_file():
        raise GrailError(
            f"sft_teacher: {generated}: no generated.parquet (a grail generate output)"
        )
    columns = ["session_id", "step_index", "generation_index", "completion", "parsed_answer",
               "gold_index"]  # fmt: skip
    table = pq.read_table(path, columns=columns).to_pylist()
    found: dict[tuple, str] = {}
    for record in sorted(table, key=lambda r: r["generation_index"]):
        key = (record["session_id"], record["step_index"])
        thought = thought_of(completion_text(record["completion"]))
        if key not in found or (
            record["parsed_answer"] == record["gold_index"] and not found[key][1]
        ):
            found[key] = (thought, record["parsed_answer"] == record["gold_index"])
    return [found.get((r["session_id"], r["step_index"]), ("", False))[0] for r in rows]


def held_out_participants(participants: list[str], fraction: float, seed: int) -> set[str]:
    """A seeded `fraction` of the distinct participants (at least one when `fraction` > 0 and
    there are two or more; never all of them).

    >>> sorted(held_out_participants(["a", "b", "b", "c", "d"], 0.5, seed=0))
    ['b', 'd']
    >>> held_out_participants(["a", "b"], 0.0, seed=0), held_out_participants(["a"], 0.5, 0)
    (set(), set())
    """
    import random

    distinct = sorted(set(participants))
    count = min(max(round(fraction * len(distinct)), 1 if fraction > 0 else 0), len(distinct) - 1)
    return set(random.Random(seed).sample(distinct, max(count, 0)))


class KeepBest(TrainerCallback):
    """Early stopping on the held-out participants' choice log-loss (``eval_loss``), the best
    model kept: each evaluation that lowers it saves the model to `out` (``save_model``, a
    collective under ZeRO-3 that gathers the shards: every process takes the same decision
    from the same gathered loss); after `patience` evaluations without a lower one, training
    stops. The best model is never reloaded into the trainer (a TrainJob node holds only its
    own ranks' shards): the next phase loads it from `out`."""

    def __init__(self, out: Path, patience: int):
        self.out, self.patience = out, patience
        self.trainer = None  # set once the trainer exists
        self.best: float | None = None
        self.step: int | None = None
        self.waited = 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if loss is None:
            return
        if self.best is None or loss < self.best:
            self.best, self.step, self.waited = loss, state.global_step, 0
            self.trainer.save_model(str(self.out))
            return
        self.waited += 1
        if self.waited >= self.patience:
            control.should_training_stop = True

    def write(
        self, out: Path, state, trained: int, held_out: int, thoughts: dict | None = None
    ) -> None:
        """``cloning.json``: the rows cloned and held out, the best held-out choice log-loss
        and its step (the saved model's), the steps taken, whether it stopped early, and the
        thoughts the replies kept (``sft_thoughts``)."""
        record = {
            "train_rows": trained,
            "held_out_rows": held_out,
            "best_held_out_choice_log_loss": self.best,
            "best_step": self.step,
            "steps": state.global_step,
            "stopped_early": state.global_step < state.max_steps,
            "thoughts": thoughts,
        }
        replace_text(out / "cloning.json", json.dumps(record, indent=1) + "\n")


def sft_examples(sft_dataset: str):
    """The SFT warm start's prompt-completion pairs from a ``grail generate`` output."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    path = Path(sft_dataset)
    path = path / "sft.parquet" if path.is_dir() else path
    if not path.is_file():
        raise GrailError(f"{sft_dataset}: no sft.parquet (a `grail generate` output)")
    rows = pq.read_table(path, columns=["messages"]).to_pylist()
    if not rows:
        raise GrailError(f"{path}: no conversations to fine-tune on (no correct completions)")
    return Dataset.from_list([prompt_completion(row["messages"]) for row in rows])


def prompt_completion(conversation: list[dict]) -> dict:
    """A ``grail generate`` conversation as TRL's conversational prompt-completion pair, so
    that SFT's loss covers the reply only (``completion_only_loss``), not the ~470 prompt
    tokens.

    >>> pair = prompt_completion([{"role": "user", "content": "Q"},
    ...                           {"role": "assistant", "content": "<answer>2</answer>"}])
    >>> pair["prompt"], pair["completion"]
    ([{'role': 'user', 'content': 'Q'}], [{'role': 'assistant', 'content': '<answer>2</answer>'}])
    """
    return {"prompt": conversation[:-1], "completion": conversation[-1:]}


def merge_adapter(folder: Path) -> None:
    """Replace the LoRA adapter saved in `folder` by the merged full model (GRPO continues
    from full weights); the base model is loaded whole, outside any ZeRO-3 partitioning."""
    from peft import AutoPeftModelForCausalLM

    from grail.train.overrides import outside_zero3

    with outside_zero3():
        merged = AutoPeftModelForCausalLM.from_pretrained(str(folder)).merge_and_unload()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        (folder / name).unlink(missing_ok=True)
    merged.save_pretrained(str(folder))


@contextmanager
def mlflow_phase(name: str, enabled: bool):
    """Log a phase into a nested MLflow run under this training's run (created if need be).

    transformers' MLflow callback resumes the run named by ``MLFLOW_RUN_ID``, so it points at
    the nested run during the phase and at the parent afterwards (for the GRPO phase).
    """
    if not enabled:
        yield
        return
    import mlflow

    parent = os.environ.get("MLFLOW_RUN_ID")
    if parent is None:
        # the experiment the environment names, as transformers' callback resolves it: an
        # earlier mlflow.set_experiment in this process may name one of another store
        named = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        experiment = mlflow.set_experiment(named).experiment_id if named else None
        with mlflow.start_run(experiment_id=experiment) as run:
            parent = run.info.run_id
    # the child made by the client: mlflow.start_run(nested=True) would resume the run that
    # MLFLOW_RUN_ID names (the parent) and rename it
    client = mlflow.MlflowClient()
    experiment = client.get_run(parent).info.experiment_id
    child = client.create_run(experiment, run_name=name, tags={"mlflow.parentRunId": parent})
    client.set_terminated(child.info.run_id)  # resumed by transformers' callback in the phase
    os.environ["MLFLOW_RUN_ID"] = parent  # for what follows the phase
    with tracking.environment_variable("MLFLOW_RUN_ID", child.info.run_id):
        yield


def end_phase(trainer) -> None:
    """Free a finished phase's engine and accelerate's state, keeping the process group: the
    next phase's trainer builds its own ``Accelerator``, which accelerate refuses to give a
    DeepSpeed plugin while an earlier one's state stands (transformers resets the same way
    when it sets up devices)."""
    from grail.train.overrides import reset_accelerator_state

    trainer.accelerator.free_memory()
    reset_accelerator_state()
