"""Training's configuration: TRL's ``GRPOConfig`` extended with grail's fields, and TRL's
``ModelConfig``, parsed by the one parser (:func:`grail.core.config.parse_config`).

A recipe is one flat YAML file; ``--key value`` on the command line overrides it, and each GAIL
field can also be set by its ``GAIL_*`` environment variable (precedence: recipe < environment <
command line). An unknown key, in the recipe or on the command line, is an error naming it.
Run ``grail train --help`` for every field with its help text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trl import GRPOConfig, ModelConfig

from grail.core.config import parse_config
from grail.core.prompts import PromptOptions
from grail.train.fields import GAIL_ENV, GrailFields
from grail.train.multigpu import deepspeed_on_cpu, use_gloo_for_deepspeed


@dataclass
class GrailConfig(GRPOConfig, GrailFields, PromptOptions):
    """GRPOConfig plus grail's data, prompt (PromptOptions), reward, checkpoint and GAIL
    discriminator fields (:class:`grail.train.fields.GrailFields`)."""

    ENVIRONMENT: ClassVar[dict[str, str]] = GAIL_ENV
    RENAMED: ClassVar[dict[str, str]] = {"opinion_task": "opinion"}

    def __post_init__(self):
        self.check_ranges()  # before TRL's own checks, so that the message names the source
        if deepspeed_on_cpu():  # before TrainingArguments sets up its devices
            use_gloo_for_deepspeed(self)
        super().__post_init__()
        PromptOptions.__post_init__(self)
        self.check()


def parse_train_args(argv: list[str]) -> tuple[GrailConfig, ModelConfig]:
    """Parse ``--config RECIPE`` plus overrides into (GrailConfig, ModelConfig)."""
    (config, model_config), _ = parse_config((GrailConfig, ModelConfig), argv, "grail train")
    return config, model_config
