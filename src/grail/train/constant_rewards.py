"""No silent dead runs: say when GRPO's rewards gave the policy nothing to learn from.

GRPO learns from differences between the completions of one prompt: when every completion of
every prompt scores the same (each group's reward spread is 0), every advantage is 0 and the
step moves nothing but the KL term. A model that never writes a parsable ``<answer>`` scores 0
on every reward forever (a real instruction model zero-shot did, for 234 s a step). TRL logs
the share of groups whose rewards did not spread as ``frac_reward_zero_std``, and each
reward's spread over the batch as ``rewards/NAME/std``; this callback reads them.
"""

from __future__ import annotations

import logging
import math

from transformers import TrainerCallback

logger = logging.getLogger("grail.train")

TAG = "grail.constant_rewards"  # the MLflow tag a dead stretch leaves on the training run


def constant_rewards(logs: dict) -> list[str]:
    """The rewards whose values did not spread over the logged batch.

    >>> constant_rewards({"rewards/accuracy/std": 0.0, "rewards/format/std": 0.4})
    ['accuracy']
    """
    return [
        key.removeprefix("rewards/").removesuffix("/std")
        for key, value in logs.items()
        if key.startswith("rewards/")
        and key.endswith("/std")
        and value is not None
        and math.isclose(value, 0.0, abs_tol=1e-9)
    ]


def stalled(logs: dict) -> bool:
    """Every group's rewards were identical over the logged steps.

    >>> stalled({"frac_reward_zero_std": 1.0}), stalled({"frac_reward_zero_std": 0.75})
    (True, False)
    """
    share = logs.get("frac_reward_zero_std")
    return share is not None and math.isclose(share, 1.0)


class ConstantRewardsCallback(TrainerCallback):
    """After `patience` steps in a row in which every group's rewards were identical: one
    line (how many steps, which rewards were constant) and a tag on the active MLflow run;
    again only after a step that learned something."""

    def __init__(self, patience: int = 3):
        self.patience = patience
        self.first: int | None = None  # the first step of the current dead stretch
        self.last_step = 0
        self.said = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "frac_reward_zero_std" not in logs:
            return
        if not stalled(logs):
            self.first, self.said = None, False
        elif self.first is None:
            self.first = self.last_step + 1
        self.last_step = state.global_step
        if self.first is None or self.said:
            return
        steps = state.global_step - self.first + 1
        if steps >= self.patience:
            self.said = True
            self.say(steps, state.global_step, constant_rewards(logs))

    def say(self, steps: int, step: int, constant: list[str]) -> None:
        which = ", ".join(constant) if constant else "none alone (their weighted sum was)"
        line = (
            f"step {step}: every completion of every prompt got the same reward for {steps} "
            f"steps in a row, so every advantage was 0 and the policy learned nothing from "
            f"them; constant over the batch: {which}. A model that never writes a parsable "
            "answer scores 0 everywhere: warm it up on the format first (sft_dataset); "
            "log_score and brier score the choice distribution after the thought, the same "
            "for every completion whose thought is the same (empty thoughts: RL adds nothing "
            "to the cloned model, docs/training.md#objectives)"
        )
        logger.warning(line)
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.set_tag(TAG, f"{steps} steps to step {step}; constant: {which}")
