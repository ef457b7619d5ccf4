"""grail's own training fields, without TRL: what ``grail train --help`` lists.

:class:`grail.train.config.TrainConfig` is TRL's ``GRPOConfig`` plus these fields and the
task's own (its ``recipe_fields``: the slate task's prompt). They live apart from it so that the
help, and anything else that only needs their names, help texts and defaults, does not import
TRL, transformers and torch (seconds).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Literal

from grail.core.config import option
from grail.core.errors import GrailError, OutOfRange
from grail.tasks import TASKS, Task, task_options


@dataclass
class GrailFields:
    """grail's data, reward, checkpoint, process, SFT and GAIL discriminator fields."""

    # Task
    task: Task = option(
        "slate: which option a person picks; summarize: document summaries rewarded by the "
        "hidden questions a reader answers from them (docs/tasks.md).",
        default="slate",
    )
    summary_mode: Literal["extractive", "abstractive"] = option(
        "Task summarize: extractive (keep numbered sentences) or abstractive (write the summary).",
        default="extractive",
    )
    summary_budget: int | None = option(
        "Task summarize: sentences (extractive) or characters (abstractive) a summary may use, "
        "stated in the prompt (default: 12 sentences, 1,200 characters).",
        default=None,
    )
    summary_reader: str | None = option(
        "Task summarize: the model reader (openai:NAME@URL, a vLLM server; or openai:NAME, an "
        "API model) of documents the deterministic reader cannot score (RepLiQA); recorded in "
        "prompt.json, so the benchmark reads with the same one.",
        default=None,
    )
    summary_judge: str | None = option(
        "Task summarize: the judge of reader answers that match the gold one neither exactly "
        "nor by token F1 (none: those count as wrong).",
        default=None,
    )
    # Data
    dataset: str | None = option(
        "Cleaned dataset: a folder (train/validation parquet), a parquet file, or an s3:// or "
        "file:// URI of a folder.",
        default=None,
    )
    issues: list[str] | None = option(
        "Keep only these issues (gun_control, minimum_wage); default all.", default=None
    )
    studies: list[str] | None = option(
        "Keep only these studies (study1, ...); default all.", default=None
    )
    train_split: str = option("Split to train on.", default="train")
    eval_split: str | None = option(
        "Split to evaluate on when eval_strategy is not 'no'.", default="validation"
    )
    max_train_rows: int | None = option(
        "Use at most this many training rows (first N).", default=None
    )
    max_eval_rows: int | None = option("Use at most this many evaluation rows.", default=None)
    # Rewards
    reward_funcs: list[str] | None = option(
        "Reward functions: names in the task's REWARDS (listed below) or dotted paths "
        "(pkg.mod:func). Weights: TRL's reward_weights, normalized to sum to 1. Default: the "
        "task's proper reward and its format (slate: log_score, format; summarize: answered, "
        "summary_format).",
        default=None,
    )
    rl_signal_guard: Literal["warn", "stop"] = option(
        "When GRPO's groups stop differing (a step is without signal when at least 95 percent "
        "of its groups' total rewards spread by at most 1e-3: every advantage 0, the policy "
        "moved by its KL term alone; grail.train.rl_signal): warn in one line, or stop "
        "training, the run's result then being its start model (the GPU recipes: RL hours that "
        "cannot move the policy are not spent).",
        default="warn",
    )
    rl_signal_patience: int = option(
        "Steps in a row without signal before rl_signal_guard acts. 4: a run that has signal "
        "only now and then (a sparse reward on a policy just learning the format) gets past "
        "a stretch of 3; the demo's 4 RL steps are one stretch.",
        default=4,
    )
    # Checkpoints
    checkpoint_uri: str | None = option(
        "Upload every saved checkpoint here (s3://bucket/prefix or file://path); "
        "--resume_from_checkpoint latest resumes from the newest complete one.",
        default=None,
    )
    fork_from: str | None = option(
        "Start a new run from a checkpoint of another run: URI@checkpoint-N (URI: that run's "
        "checkpoint_uri, s3:// or a folder). Its weights, optimizer, scheduler, step count and "
        "GAIL discriminator are restored from that checkpoint (downloaded into output_dir, "
        "checked against its upload marker); the other run's checkpoints are only read. The "
        "fork has its own output_dir and checkpoint_uri (whose _RUN.json records the parent); "
        "a resume of the fork (resume_from_checkpoint: latest) continues the fork's own "
        "checkpoints, and the fork point only while it has none. No warm start in a fork: "
        "model_name_or_path is the parent's start (its reference model).",
        default=None,
    )
    upload_final: bool = option(
        "Also upload the final model to checkpoint_uri/final when training ends (marker last): "
        "how a TrainJob hands its result back to the train task.",
        default=False,
    )
    # Processes
    num_processes: int = option(
        "Training processes in this pod: 0 starts one per visible GPU (DeepSpeed ZeRO-3 when "
        "there are several); N > 1 forces N (data-parallel over gloo on a CPU machine).",
        default=0,
    )
    gradient_checkpointing_by_memory: bool = option(
        "On a CUDA device, set gradient_checkpointing from a memory estimate (16 bytes per "
        "trained parameter, the reference model, vLLM's share, one micro-batch's activations "
        "without checkpointing) against the GPU's memory, printed at start "
        "(grail.train.memory); false: the recipe's gradient_checkpointing stands.",
        default=True,
    )
    share_group_prompts: bool = option(
        "Read each prompt once per group: a group's completions packed after one copy of "
        "their prompt (a 4-D or block mask; SDPA, eager or sdpa_flex attention, RoPE, full "
        "attention) in the "
        "reference's, the old-log-prob and the policy's training forwards, the generation "
        "batch shuffled by group so micro-batches hold whole groups (grail.train.grpo); the "
        "same log-probabilities up to rounding. false: every completion's row carries its "
        "prompt, as TRL sends it.",
        default=True,
    )
    # SFT warm-start
    sft_dataset: str | None = option(
        "Run TRL's SFTTrainer first on this output of grail generate (folder with sft.parquet, "
        "or the file), or on choices: the train split's own choices (behaviour cloning: each "
        "prompt's reply picks the option the person chose), then GRPO/GRAIL from the "
        "fine-tuned model (the run's step 0).",
        default=None,
    )
    rl: bool = option(
        "Run GRPO (GRAIL with gail_use) after the SFT warm start; false: the warm start's model "
        "is the result (with sft_dataset: choices, behaviour cloning alone).",
        default=True,
    )
    sft_num_train_epochs: float = option("SFT epochs over sft_dataset.", default=1.0)
    sft_max_steps: int = option("SFT steps; -1 means use sft_num_train_epochs.", default=-1)
    sft_learning_rate: float = option("SFT learning rate.", default=1e-5)
    sft_batch_size: int | None = option(
        "SFT batch per device (default: per_device_train_batch_size, GRPO's). The tiny policy "
        "clones in batches of 16: more, smaller steps for the same compute, and the lookups "
        "that make it read form within the demo's cloning (docs/results.md).",
        default=None,
    )
    sft_warmup_ratio: float = option(
        "Share of the SFT steps over which the learning rate warms up linearly from 0.",
        default=0.1,
    )
    sft_max_length: int = option(
        "SFT sequence length in tokens (longer ones are truncated).", default=2048
    )
    sft_format_weight: float = option(
        "Behaviour cloning (sft_dataset: choices) is maximum likelihood of the person's option "
        "token (weight 1); the reply's other tokens, its format, weigh this much (0 lets the "
        "format drift: replies lose their tags).",
        default=0.1,
    )
    sft_option_score_weight: float = option(
        "Behaviour cloning also scores each option where its line ends in the prompt: one "
        "logit there (the end-of-turn token's), a softmax over the slate's lines, the "
        "person's choice its target, at this weight. Each line's score needs only that line "
        "and the viewer, so the policy learns what makes an option chosen before it learns "
        "to point from the answer to a line; the benchmark still reads the answer. 0: off "
        "(docs/training.md#what-a-recipe-needs-for-its-model-to-read).",
        default=0.0,
    )
    sft_thoughts: Literal["empty", "own", "teacher"] = option(
        "Behaviour cloning: the thought each cloned reply keeps before its answer. empty: "
        "<think></think> (cloning then teaches the model to skip thinking, and a log-score "
        "GRPO after it has no signal: docs/training.md#objectives); own: one the start model "
        "samples itself for that prompt (recipe temperature, max_completion_length tokens); "
        "teacher: the thought of sft_teacher's reply to that prompt. With a thought, the "
        "cloned model's prompt opens it (<think>) and the loss is on the answer alone, never "
        "on the thought's tokens or on where it closes.",
        default="empty",
    )
    sft_thought_loss: bool = option(
        "sft_thoughts own or teacher: also put the loss on the thought's tokens and its "
        "</think>, weighed as the format (sft_format_weight). Off (the default), cloning "
        "never scores the thought. On with own thoughts, it is the likelihood of the start "
        "model's own samples, whose gradient has zero mean at the start model: it teaches no "
        "new thought and anchors the model's thinking, which cloning's answer loss otherwise "
        "erodes (SmolLM2-135M stopped thinking: docs/results.md).",
        default=False,
    )
    sft_thought_sentences: int | None = option(
        "sft_thoughts own or teacher: keep each cloned thought's first this many sentences (a "
        "sentence ends at . ! ? or a line break), then cut to max_completion_length. A prefix "
        "of the thought is still the one written; a thought cut at the token budget instead "
        "ends mid-sentence and teaches a model to ramble until it is cut (SmolLM2-135M: "
        "docs/results.md). Unset: the whole thought.",
        default=None,
    )
    sft_teacher: str | None = option(
        "sft_thoughts: teacher: a grail generate output (folder with generated.parquet) whose "
        "replies' thoughts the cloned replies keep, matched by session and step (open-r1 "
        "distils reasoning the same way).",
        default=None,
    )
    sft_reuse: str | None = option(
        "A warm start made earlier (a folder training wrote as output_dir/sft, with its "
        "made_from.json): adopted instead of cloning when its settings, its examples and its "
        "start model's files are this run's, byte for byte; otherwise this run clones and "
        "says in one line what differs (the DAG's tiny-models task clones once per issue for "
        "every branch of the embedded default). A run of several processes clones anew.",
        default=None,
    )
    sft_max_train_rows: int | None = option(
        "Behaviour cloning: clone at most this many train rows (first N); default the whole "
        "train split (max_train_rows limits GRPO's prompts only).",
        default=None,
    )
    sft_holdout_fraction: float = option(
        "Behaviour cloning: share of the train split's participants held out (seeded; never "
        "trained on) to evaluate the choice log-loss on and stop early; 0: no hold-out, no "
        "early stopping.",
        default=0.1,
    )
    sft_eval_steps: int = option(
        "Behaviour cloning: evaluate on the held-out participants every N steps (0: each epoch).",
        default=0,
    )
    sft_early_stopping_patience: int = option(
        "Behaviour cloning: stop after this many evaluations without a lower held-out choice "
        "log-loss; the best model is kept.",
        default=2,
    )
    # GAIL discriminator (GRAIL); each also settable as the GAIL_* environment variable.
    gail_use: bool = option(
        "Add the GAIL discriminator reward (GRAIL). Env GAIL_USE.", default=False
    )
    gail_weight: float = option(
        "Mixing weight of the discriminator reward: rewards are (1-w) * base + w * disc. "
        "With gail_learnable_weight, the ceiling of the adapted weight. Env GAIL_WEIGHT.",
        default=0.5,
    )
    gail_alpha: float = option(
        "Discriminator reward = alpha * P(real) for valid answers. Env GAIL_ALPHA.", default=1.0
    )
    gail_lr: float = option("Discriminator learning rate (AdamW). Env GAIL_LR.", default=2e-5)
    gail_weight_decay: float = option(
        "Discriminator AdamW weight decay: the features discriminator's regularisation (a "
        "logistic regression on thousands of sparse crosses over-fits without it). "
        "Env GAIL_WEIGHT_DECAY.",
        default=0.01,
    )
    gail_discriminator: str = option(
        "What the discriminator is: 'classifier' (gail_model, a sequence classifier reading "
        "the text) or 'features' (a logistic regression on hashed crosses of the text's state "
        "fragments and the chosen option's position and words, the task's "
        "discriminator_features: it learns who clicks what from a few hundred pairs, where a small "
        "classifier trained from scratch stays at chance; gail_model unset). "
        "Env GAIL_DISCRIMINATOR.",
        default="classifier",
    )
    gail_model: str | None = option(
        "Sequence classifier to use as discriminator (path or hub id; one logit), with "
        "gail_discriminator: classifier. Env GAIL_MODEL.",
        default=None,
    )
    gail_device: str = option(
        "Device of the discriminator: auto (this process's accelerator), "
        "cpu, cuda, cuda:N. Env GAIL_DEVICE.",
        default="auto",
    )
    gail_replay_size: int = option(
        "Replay buffer capacity in (text, label) pairs, oldest dropped "
        "first. Env GAIL_REPLAY_SIZE.",
        default=4096,
    )
    gail_minibatch: int = option(
        "Pairs per discriminator update (half real, half policy). Env GAIL_MINIBATCH.", default=32
    )
    gail_updates_per_step: int = option(
        "Discriminator updates after each training step; 0 keeps "
        "it fixed. Env GAIL_UPDATES_PER_STEP.",
        default=1,
    )
    gail_eval_mode: str = option(
        "During evaluation: 'frozen' scores with the discriminator but never updates it or "
        "fills the buffer; 'off' gives no discriminator reward. Env GAIL_EVAL_MODE.",
        default="frozen",
    )
    gail_learnable_weight: bool = option(
        "Set the mixing weight from how well the discriminator tells people from the policy on "
        "pairs it has not trained on: after pre-training, gail_weight * its edge on the "
        "held-out prompts (2 * (balanced accuracy - one standard error) - 1, clipped to "
        "[0, 1]); then each step a tenth of the way toward gail_weight * its edge on the "
        "step's fresh pairs, before they enter the buffer. A discriminator at chance gets 0, "
        "whatever its bias. Env GAIL_LEARNABLE_WEIGHT.",
        default=False,
    )
    gail_pretrain_prompts: int = option(
        "Before the first RL step, train the discriminator on people's choices against the "
        "start model's own sampled replies for this many prompts of the train split (seeded, "
        "not limited by max_train_rows; a quarter "
        "held out to set the learnable weight); 0: no pre-training (the first rewards are an "
        "untrained classifier's). Not repeated on resume. Env GAIL_PRETRAIN_PROMPTS.",
        default=256,
    )
    gail_pretrain_updates: int = option(
        "Minibatch updates of that pre-training (gail_minibatch pairs each, half real). "
        "Env GAIL_PRETRAIN_UPDATES.",
        default=200,
    )
    gail_context: str = option(
        "What the discriminator reads besides the viewer state: 'slate' (the chosen option and "
        "the whole slate it was chosen from: whether a choice is people's depends on what else "
        "was offered) or 'choice' (the chosen option alone). Env GAIL_CONTEXT.",
        default="slate",
    )
    gail_max_grad_norm: float = option(
        "Clip the discriminator's gradient norm to this (0: no clipping). Env GAIL_MAX_GRAD_NORM.",
        default=1.0,
    )
    gail_max_length: int = option(
        "Discriminator input length in tokens. Env GAIL_MAX_LENGTH.", default=512
    )

    def check_ranges(self) -> None:
        """Non-finite numbers (:func:`grail.core.config.check_finite`) and numeric values out of
        their field's range (:data:`RANGES`), one line naming the field."""
        from grail.core.config import check_finite

        check_finite(self)
        for name in RANGES:
            problem = out_of_range(name, getattr(self, name, None))
            if problem:
                raise OutOfRange(name, problem)

    def check(self) -> None:
        """Values no type can refuse (raised as one line naming the field)."""
        from grail.core.storage import check_uri

        if self.checkpoint_uri:  # keys stored as typed: no '..', no leading '/'
            try:
                check_uri(self.checkpoint_uri)
            except GrailError as err:
                raise OutOfRange("checkpoint_uri", f"checkpoint_uri: {err}") from None
        from grail.core.rewards import resolve_rewards

        if self.reward_funcs is None:  # the task's default: a proper reward, and its format
            self.reward_funcs = list(TASKS[self.task].default_rewards)
        try:  # before any model loads; the error names the recipe (OutOfRange)
            resolve_rewards(
                self.reward_funcs, getattr(self, "reward_weights", None), TASKS[self.task].rewards
            )
        except OutOfRange:
            raise
        except GrailError as err:
            raise OutOfRange("reward_funcs", f"reward_funcs: {err}") from None
        TASKS[self.task].check_training(self)
        if getattr(self, "use_transformers_continuous_batching", False) and (
            getattr(self, "bf16", False) or getattr(self, "fp16", False)
        ):  # TRL 1.16 casts the trained model to half precision before generate_batch
            raise OutOfRange(
                "use_transformers_continuous_batching",
                "use_transformers_continuous_batching: TRL casts the trained weights to "
                "bf16/fp16 on its first generation and they stay there (the fp32 master "
                "weights are lost, so small updates round away); generate with use_vllm or "
                "the default generate (docs/pins.md#trl-116)",
            )
        self.check_cloning()
        self.check_fork()
        if not self.rl and not self.sft_dataset:
            raise OutOfRange(
                "rl", "rl: false trains nothing without sft_dataset (choices: behaviour cloning)"
            )
        if self.gail_eval_mode not in ("frozen", "off"):
            raise GrailError(
                f"gail_eval_mode must be 'frozen' or 'off', got {self.gail_eval_mode!r}"
            )
        for name in ("max_train_rows", "max_eval_rows"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise GrailError(f"{name} must be at least 1 (or unset), got {getattr(self, name)}")
        if self.gail_context not in ("choice", "slate"):
            raise GrailError(f"gail_context must be 'choice' or 'slate', got {self.gail_context!r}")
        if not 0.0 <= self.gail_weight <= 1.0:
            raise GrailError(f"gail_weight must be within [0, 1], got {self.gail_weight}")
        if self.gail_discriminator not in ("classifier", "features"):
            raise GrailError(
                "gail_discriminator must be 'classifier' or 'features', "
                f"got {self.gail_discriminator!r}"
            )
        if self.gail_use and self.gail_discriminator == "classifier" and not self.gail_model:
            raise GrailError("gail_use is on but gail_model is not set")
        if self.gail_discriminator == "features" and self.gail_model:
            raise GrailError(
                "gail_model is read by gail_discriminator: classifier only "
                "(gail_discriminator: features reads no model)"
            )

    @property
    def discriminator_model(self) -> str | None:
        """The classifier this run reads as its discriminator; None without one."""
        use = self.gail_use and self.gail_discriminator == "classifier"
        return self.gail_model if use else None

    def check_cloning(self) -> None:
        """Behaviour cloning's thought settings, each only with what it needs."""
        if self.sft_thoughts != "empty" and self.sft_dataset != "choices":
            raise OutOfRange(
                "sft_thoughts",
                f"sft_thoughts: {self.sft_thoughts} is behaviour cloning's: set sft_dataset: "
                "choices",
            )
        if self.sft_thought_loss and self.sft_thoughts == "empty":
            raise OutOfRange(
                "sft_thought_loss",
                "sft_thought_loss: scores a cloned thought: set sft_thoughts: own or teacher",
            )
        if self.sft_thought_sentences is not None and (
            self.sft_thoughts == "empty" or self.sft_thought_sentences < 1
        ):
            raise OutOfRange(
                "sft_thought_sentences",
                "sft_thought_sentences: 1 or more, with sft_thoughts: own or teacher",
            )
        if self.sft_reuse and not self.sft_dataset:
            raise OutOfRange("sft_reuse", "sft_reuse: a warm start to adopt: set sft_dataset")
        if (self.sft_thoughts == "teacher") != bool(self.sft_teacher):
            raise OutOfRange(
                "sft_teacher",
                "sft_teacher: set it (a grail generate output) with sft_thoughts: teacher, "
                "and only then",
            )

    def check_fork(self) -> None:
        """``fork_from`` is ``URI@checkpoint-N`` of another run's checkpoint_uri."""
        if self.fork_from is None:
            return
        from grail.core.checkpoints import fork_point

        uri, _ = fork_point(self.fork_from)
        if self.checkpoint_uri and uri.rstrip("/") == self.checkpoint_uri.rstrip("/"):
            raise OutOfRange(
                "fork_from",
                f"fork_from: {self.fork_from} is in this run's own checkpoint_uri: a fork "
                "writes to a checkpoint_uri of its own (resume_from_checkpoint: latest "
                "continues a run)",
            )


# Numeric fields (TRL's GRPOConfig and grail's) whose out-of-range values would train wrongly or
# crash after the model loads: name -> (low, low allowed, high or None). `beta: -1` reverses the
# KL penalty; a learning rate or temperature <= 0 fails inside the trainer.
RANGES = {
    "learning_rate": (0, False, None),
    "beta": (0, True, None),
    "temperature": (0, False, None),
    "top_p": (0, False, 1),
    "num_generations": (2, True, None),
    "max_completion_length": (1, True, None),
    "weight_decay": (0, True, None),
    "warmup_ratio": (0, True, 1),
    "epsilon": (0, True, None),
    "epsilon_high": (0, True, None),
    "save_steps": (0, False, None),
    "logging_steps": (0, False, None),
    "eval_steps": (0, False, None),
    "max_steps": (-1, True, None),  # -1: TRL's "by epochs"
    "sft_max_steps": (-1, True, None),
    "per_device_train_batch_size": (1, True, None),
    "per_device_eval_batch_size": (1, True, None),
    "gradient_accumulation_steps": (1, True, None),
    "max_grad_norm": (0, True, None),
    "num_train_epochs": (0, False, None),
    "steps_per_generation": (1, True, None),
    "generation_batch_size": (1, True, None),
    "num_iterations": (1, True, None),
    "sft_learning_rate": (0, False, None),
    "sft_max_length": (1, True, None),
    "sft_batch_size": (1, True, None),
    "sft_num_train_epochs": (0, False, None),
    "sft_warmup_ratio": (0, True, 0.5),
    "sft_format_weight": (0, True, 1),
    "sft_option_score_weight": (0, True, None),
    "sft_max_train_rows": (1, True, None),
    "sft_holdout_fraction": (0, True, 0.5),
    "sft_eval_steps": (0, True, None),
    "sft_early_stopping_patience": (1, True, None),
    "gail_alpha": (0, True, None),
    "gail_lr": (0, False, None),
    "gail_weight_decay": (0, True, None),
    "gail_replay_size": (1, True, None),
    "gail_minibatch": (2, True, None),
    "gail_updates_per_step": (0, True, None),
    "gail_max_grad_norm": (0, True, None),
    "gail_max_length": (1, True, None),
    "gail_pretrain_prompts": (0, True, None),
    "rl_signal_patience": (1, True, None),
    "gail_pretrain_updates": (0, True, None),
    "history_depth": (0, True, None),
}


def out_of_range(name: str, value) -> str | None:
    """What is wrong with `value` for field `name` (:data:`RANGES`), or None.

    >>> out_of_range("beta", -1), out_of_range("top_p", 1.5), out_of_range("beta", 0.0)
    ('beta must be >= 0, got -1', 'top_p must be within (0, 1], got 1.5', None)
    """
    if name not in RANGES or not isinstance(value, int | float) or isinstance(value, bool):
        return None
    low, inclusive, high = RANGES[name]
    if (value < low if inclusive else value <= low) or (high is not None and value > high):
        if high is None:
            allowed = f"{'>=' if inclusive else '>'} {low}"
        else:
            allowed = f"within {'[' if inclusive else '('}{low}, {high}]"
        return f"{name} must be {allowed}, got {value}"
    return None


# Each gail_* field can also be set by its GAIL_* environment variable.
GAIL_ENV = {f.name: f.name.upper() for f in fields(GrailFields) if f.name.startswith("gail_")}


def grail_help() -> str:
    """``grail train --help``: grail's own recipe fields; TRL's behind ``--help-all``."""
    lines = [
        "usage: grail train --config RECIPE [--FIELD VALUE ...]",
        "",
        "Trains with TRL's GRPOTrainer (GRPO, or GRAIL with gail_use). Every field can be set in",
        "the recipe (flat YAML) or on the command line (--field value); unknown fields are errors.",
        "",
        "grail's fields:",
    ]
    for field in (*fields(task_options("recipe_fields")), *fields(GrailFields)):
        default = field.default if field.default is not MISSING else field.default_factory()
        text = field.metadata.get("help", "")
        lines.append(f"  --{field.name} (default {default!r})\n      {text}")
    lines += ["", "Rewards (reward_funcs), by task, and what each is optimal at:"]
    for name, task in TASKS.items():
        lines.append(f"  {name} (default {', '.join(task.default_rewards)}):")
        lines += [f"    {reward}: {note}" for reward, note in task.reward_notes.items()]
    lines += [
        "",
        "Also accepted: every field of TRL's GRPOConfig (learning_rate, max_steps,",
        "num_generations, use_vllm, vllm_mode, ...) and ModelConfig (model_name_or_path, dtype,",
        "use_peft, lora_*): grail train --help-all lists them.",
    ]
    return "\n".join(lines)
