"""Training configuration: TRL's ``GRPOConfig`` extended with grail's fields, and ``ModelConfig``.

A recipe is one flat YAML file; ``--key value`` on the command line overrides it, and each GAIL
field can also be set by its ``GAIL_*`` environment variable (precedence: recipe < environment <
command line). An unknown key, in the recipe or on the command line, is an error naming it.
Run ``grail train --help`` for every field with its help text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from trl import GRPOConfig, ModelConfig, TrlParser

from grail.errors import GrailError


def _help(text: str, **kwargs):
    return field(metadata={"help": text}, **kwargs)


@dataclass
class GrailConfig(GRPOConfig):
    """GRPOConfig plus grail's data, prompt, reward, checkpoint and GAIL discriminator fields."""

    # Data
    dataset: str | None = _help(
        "Cleaned dataset: a folder (train/validation parquet), a parquet file, or an s3:// or "
        "file:// URI of a folder.",
        default=None,
    )
    issues: list[str] | None = _help(
        "Keep only these issues (gun_control, minimum_wage); default all.", default=None
    )
    studies: list[str] | None = _help(
        "Keep only these studies (study1, ...); default all.", default=None
    )
    train_split: str = _help("Split to train on.", default="train")
    eval_split: str | None = _help(
        "Split to evaluate on when eval_strategy is not 'no'.", default="validation"
    )
    max_train_rows: int | None = _help(
        "Use at most this many training rows (first N).", default=None
    )
    max_eval_rows: int | None = _help("Use at most this many evaluation rows.", default=None)
    # Prompt
    system_prompt: str | None = _help(
        "System prompt; default grail.prompts.SYSTEM_PROMPT.", default=None
    )
    history_depth: int = _help("Most recent watched videos shown; 0 = all.", default=12)
    show_ids: bool = _help("Show video ids in the prompt.", default=False)
    shuffle_seed: int | None = _help(
        "Seed of the option shuffle (gold_index remapped); unset keeps the displayed order.",
        default=None,
    )
    opinion_task: bool = _help("Also ask for the opinion direction (<opinion> tag).", default=False)
    # Rewards
    reward_funcs: list[str] = _help(
        "Reward functions: names in grail.rewards.REWARDS or dotted paths (pkg.mod:func). "
        "Weights: TRL's reward_weights, normalized to sum to 1.",
        default_factory=lambda: ["accuracy", "format"],
    )
    # Checkpoints
    checkpoint_uri: str | None = _help(
        "Upload every saved checkpoint here (s3://bucket/prefix or file://path); "
        "--resume_from_checkpoint latest resumes from the newest complete one.",
        default=None,
    )
    # Processes
    num_processes: int = _help(
        "Training processes in this pod: 0 starts one per visible GPU (DeepSpeed ZeRO-3 when "
        "there are several); N > 1 forces N (data-parallel over gloo on a CPU machine).",
        default=0,
    )
    # SFT warm-start
    sft_dataset: str | None = _help(
        "Run TRL's SFTTrainer first on this `grail generate` output (folder with sft.parquet, or "
        "the file), then GRPO/GRAIL from the fine-tuned model.",
        default=None,
    )
    sft_num_train_epochs: float = _help("SFT epochs over sft_dataset.", default=1.0)
    sft_max_steps: int = _help("SFT steps; -1 means use sft_num_train_epochs.", default=-1)
    sft_learning_rate: float = _help("SFT learning rate.", default=1e-5)
    sft_max_length: int = _help(
        "SFT sequence length in tokens (longer ones are truncated).", default=2048
    )
    # GAIL discriminator (GRAIL); each also settable as the GAIL_* environment variable.
    gail_use: bool = _help(
        "Add the GAIL discriminator reward (GRAIL). Env GAIL_USE.", default=False
    )
    gail_weight: float = _help(
        "Mixing weight of the discriminator reward: rewards are (1-w) * base + w * disc. "
        "With gail_learnable_weight, the ceiling of the adapted weight. Env GAIL_WEIGHT.",
        default=0.5,
    )
    gail_alpha: float = _help(
        "Discriminator reward = alpha * P(real) for valid answers. Env GAIL_ALPHA.", default=1.0
    )
    gail_lr: float = _help("Discriminator learning rate (AdamW). Env GAIL_LR.", default=2e-5)
    gail_model: str | None = _help(
        "Sequence classifier to use as discriminator (path or hub id; one logit). Env GAIL_MODEL.",
        default=None,
    )
    gail_device: str = _help(
        "Device of the discriminator: auto (this process's accelerator), "
        "cpu, cuda, cuda:N. Env GAIL_DEVICE.",
        default="auto",
    )
    gail_replay_size: int = _help(
        "Replay buffer capacity in (text, label) pairs, oldest dropped "
        "first. Env GAIL_REPLAY_SIZE.",
        default=4096,
    )
    gail_minibatch: int = _help(
        "Pairs per discriminator update (half real, half policy). Env GAIL_MINIBATCH.", default=32
    )
    gail_updates_per_step: int = _help(
        "Discriminator updates after each training step; 0 keeps "
        "it fixed. Env GAIL_UPDATES_PER_STEP.",
        default=1,
    )
    gail_eval_mode: str = _help(
        "During evaluation: 'frozen' scores with the discriminator but never updates it or "
        "fills the buffer; 'off' gives no discriminator reward. Env GAIL_EVAL_MODE.",
        default="frozen",
    )
    gail_learnable_weight: bool = _help(
        "Start the mixing weight at 0 and move it each step a tenth of the way toward "
        "gail_weight * clip(2 * accuracy - 1, 0, 1), the accuracy measured on the step's fresh "
        "pairs before they enter the buffer. Env GAIL_LEARNABLE_WEIGHT.",
        default=False,
    )
    gail_context: str = _help(
        "What the discriminator reads besides the viewer state: 'choice' (the chosen option) "
        "or 'slate' (the chosen option and the whole slate, as upstream). Env GAIL_CONTEXT.",
        default="choice",
    )
    gail_max_grad_norm: float = _help(
        "Clip the discriminator's gradient norm to this (0: no clipping). Env GAIL_MAX_GRAD_NORM.",
        default=1.0,
    )
    gail_max_length: int = _help(
        "Discriminator input length in tokens. Env GAIL_MAX_LENGTH.", default=512
    )

    def __post_init__(self):
        super().__post_init__()
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
        if self.gail_use and not self.gail_model:
            raise GrailError("gail_use is on but gail_model is not set")


GAIL_ENV = {f.name: f.name.upper() for f in fields(GrailConfig) if f.name.startswith("gail_")}


def read_recipe(path: str | Path) -> dict:
    """The recipe's key/values (a flat YAML mapping)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise GrailError(f"{path}: recipe not found") from None
    except yaml.YAMLError as err:
        raise GrailError(f"{path}: not valid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise GrailError(f"{path}: a recipe is a flat mapping of key: value")
    return data


def _accepts(kind, value) -> bool:
    """Whether a recipe value fits a field's type (recipes are YAML: lists, numbers, text)."""
    import types
    import typing

    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(k, value) for k in typing.get_args(kind))
    if value is None:
        return kind is type(None)
    if origin in (list, tuple) or kind in (list, tuple):
        return True  # one value or a list: the parser makes a list of either
    if origin is dict or kind is dict:
        return isinstance(value, dict | str)
    if isinstance(value, list | dict):
        return False
    if kind is bool:
        return isinstance(value, bool) or str(value).lower() in ("true", "false")
    if kind in (int, float):
        try:
            return float(value) == float(value)
        except (TypeError, ValueError):
            return False
    return True


def check_recipe_types(values: dict, source: str) -> None:
    """A value of the wrong kind (``learning_rate: [1, 2]``) is an error naming the key, before
    any model is loaded."""
    import typing

    hints = typing.get_type_hints(GrailConfig) | typing.get_type_hints(ModelConfig)
    for key, value in values.items():
        if key in hints and not _accepts(hints[key], value):
            raise GrailError(f"{source}: {key}: {value!r} is not a valid value for this field")


def parse_train_args(argv: list[str]) -> tuple[GrailConfig, ModelConfig]:
    """Parse ``--config RECIPE`` plus overrides into (GrailConfig, ModelConfig)."""
    parser = TrlParser((GrailConfig, ModelConfig))
    argv = list(argv)
    values: dict = {}
    source = "command line"
    if "--config" in argv:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise GrailError("--config needs a recipe path")
        source = argv[at + 1]
        values = read_recipe(source)
        del argv[at : at + 2]
    values |= {key: os.environ[env] for key, env in GAIL_ENV.items() if env in os.environ}
    check_recipe_types(values, source)
    unknown = parser.set_defaults_with_config(**values)[::2]
    if unknown:
        raise GrailError(
            f"{source}: unknown recipe key {unknown[0][2:]!r}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    try:
        config, model_config, extra = parser.parse_args_into_dataclasses(
            args=argv, return_remaining_strings=True
        )
    except ValueError as err:
        raise GrailError(str(err)) from None
    if extra:
        raise GrailError(f"unknown option {extra[0]!r}")
    return config, model_config
