"""Training's configuration: TRL's ``GRPOConfig`` extended with grail's fields, and TRL's
``ModelConfig``, parsed by the one parser (:func:`grail.core.config.parse_config`).

A recipe is one flat YAML file; ``--key value`` on the command line overrides it, and each GAIL
field can also be set by its ``GAIL_*`` environment variable (precedence: recipe < environment <
command line). An unknown key, in the recipe or on the command line, is an error naming it.
Run ``grail train --help`` for every field with its help text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from trl import GRPOConfig, ModelConfig

from grail.core.config import check_recipe_types, parse_config
from grail.core.errors import GrailError, OutOfRange
from grail.tasks import task_options
from grail.train.fields import GAIL_ENV, GrailFields
from grail.train.multigpu import deepspeed_on_cpu, use_gloo_for_deepspeed

# the task's own recipe fields (the slate task's prompt: history_depth, show_ids, ...)
TaskFields = task_options("recipe_fields")


@dataclass
class TrainConfig(GRPOConfig, GrailFields, TaskFields):
    """GRPOConfig plus grail's data, prompt (the task's recipe fields), reward, checkpoint and
    GAIL discriminator fields (:class:`grail.train.fields.GrailFields`)."""

    ENVIRONMENT: ClassVar[dict[str, str]] = GAIL_ENV
    RENAMED: ClassVar[dict[str, str]] = {"opinion_task": "opinion"}

    def __post_init__(self):
        self.check_ranges()  # before TRL's own checks, so that the message names the source
        if deepspeed_on_cpu():  # before TrainingArguments sets up its devices
            use_gloo_for_deepspeed(self)
        try:
            super().__post_init__()
        except ValueError as error:  # TRL's bf16 default on a machine without bf16
            if "bf16" not in str(error):
                raise
            raise OutOfRange(
                "bf16",
                "bf16: true (TRL's default, or the recipe's) needs bf16 on this machine's GPU: "
                "set bf16: false in the recipe (or --bf16 false)",
            ) from None
        TaskFields.__post_init__(self)
        self.check()


# ModelConfig fields grail's model loading does not apply: refused, never silently ignored.
NOT_APPLIED = {
    "load_in_4bit": "grail does not quantize the base model (no bitsandbytes in the image); "
    "LoRA (use_peft) on a bf16 base fits an H100",
    "load_in_8bit": "grail does not quantize the base model (no bitsandbytes in the image)",
    "use_bnb_nested_quant": "grail does not quantize the base model",
}


# Secrets TrainingArguments would keep: the trainer pickles its arguments into
# training_args.bin in output_dir and every checkpoint (uploaded to checkpoint_uri)
SECRETS = {
    "hub_token": "a secret is never a training argument (the trainer saves its arguments in "
    "training_args.bin, in every checkpoint): set HF_TOKEN in the environment instead",
}


def parse_train_args(argv: list[str]) -> tuple[TrainConfig, ModelConfig]:
    """Parse ``--config RECIPE`` plus overrides into (TrainConfig, ModelConfig)."""
    (config, model_config), _ = parse_config((TrainConfig, ModelConfig), argv, "grail train")
    for name, why in NOT_APPLIED.items():
        if getattr(model_config, name):
            raise GrailError(f"{name}: {why}")
    for name, why in SECRETS.items():
        if getattr(config, name):
            raise GrailError(f"{name}: {why}")
    return config, model_config


def check_recipe(values: dict, source: str) -> None:
    """A resolved recipe (file and overrides) checked as `grail train` will parse it, without
    building TRL's config (which needs the training machine): unknown keys, types, ranges and
    reward names, each one line naming `source` and the key. The pipeline's first task runs it
    for every branch, before any stage."""
    from dataclasses import fields

    from grail.core.rewards import resolve_rewards
    from grail.tasks import DEFAULT_TASK, TASKS
    from grail.train.fields import RANGES, out_of_range

    types = (TrainConfig, ModelConfig)
    renamed = {old: new for kind in types for old, new in getattr(kind, "RENAMED", {}).items()}
    values = {renamed.get(key, key): value for key, value in values.items()}
    known = {f.name for kind in types for f in fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise GrailError(f"{source}: unknown recipe key {unknown[0]!r}")
    check_recipe_types(values, source, types)
    for name, why in (NOT_APPLIED | SECRETS).items():
        if values.get(name):
            raise GrailError(f"{source}: {name}: {why}")
    for name, value in values.items():
        items = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            raise GrailError(f"{source}: {name} must be a finite number, got {value}")
    for name in RANGES:
        problem = out_of_range(name, values.get(name))
        if problem:
            raise GrailError(f"{source}: {problem}")
    rewards = values.get("reward_funcs")
    if rewards is not None:
        try:
            resolve_rewards(
                [rewards] if isinstance(rewards, str) else rewards,
                values.get("reward_weights"),
                TASKS[values.get("task", DEFAULT_TASK)].rewards,
            )
        except GrailError as err:
            raise GrailError(f"{source}: reward_funcs: {err}") from None
