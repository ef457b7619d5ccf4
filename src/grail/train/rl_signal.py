"""Whether RL had anything to learn from, said in words, and a guard that stops when it had not.

GRPO learns from differences between the completions of one prompt: a group whose total reward
does not spread gives every completion an advantage of 0, and a step whose groups all look
like that moves the policy by its KL term alone. After behaviour cloning with empty thoughts
that is the rule, not the exception: the log score of the policy's choice distribution after
the thought never depends on the sampled answer, so every completion of a prompt scores the
same (the demo's 4 RL steps: 127 of 128 groups, grad norm 0; docs/training.md#objectives).

:class:`RLSignal` is told each generation batch's rewards (every reward function's, gathered
across processes, and the trainer's weights: ``GrailGRPOTrainer._calculate_rewards``) and the
replies' thoughts. Per step it logs ``rl/zero_spread_share`` (the share of groups whose total
reward's standard deviation is at most :data:`SPREAD_FLOOR`), ``rl/within_group_std`` (the
mean standard deviation inside a group: what advantages are made of),
``rl/between_group_std`` (the standard deviation of the groups' means: what the prompts alone
explain), ``rl/thought_share`` and ``rl/thought_chars`` (replies with a non-empty thought,
their mean length) and, for GRAIL, ``rl/gail_weight`` (the discriminator's effective weight).
A step whose share is at least :data:`NO_SIGNAL_SHARE` has no signal. After ``patience``
such steps in a row it warns in one line, or with ``rl_signal_guard: stop`` stops training
(the run's result is then its start model: the steps taken moved it by the KL term alone).
:meth:`RLSignal.verdict` says it for the run summary, the MLflow tag ``rl_signal`` and the
closing table.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from transformers import TrainerCallback

from grail.core.rewards import opened

logger = logging.getLogger("grail.train")

TAG = "rl_signal"  # the MLflow tag the training run gets: the verdict in words
# A group "has no spread" when its total reward's standard deviation is at most this. The log
# score of two identical prefixes differs by ~1e-6 in fp32 between rows of one padded batch,
# and by up to ~1e-3 under bf16 autocast; a reply that earns or loses a format point, an
# answer that differs, or a discriminator that tells two choices apart moves it by 1e-2 and
# more. Rounding is not a signal.
SPREAD_FLOOR = 1e-3
NO_SIGNAL_SHARE = 0.95  # a step is without signal when at least this share of its groups is
THOUGHT = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@dataclass
class Step:
    """One step's signal: its groups, those without spread, the two standard deviations,
    the replies with a thought and their mean length, GAIL's weight (None without GAIL)."""

    step: int
    groups: int
    zero_spread: int
    within_std: float
    between_std: float
    thought_share: float
    thought_chars: float
    gail_weight: float | None = None
    tagged_share: float = 1.0  # replies with a <think> tag, empty or not

    @property
    def zero_share(self) -> float:
        return self.zero_spread / self.groups if self.groups else 1.0

    @property
    def has_signal(self) -> bool:
        return self.zero_share < NO_SIGNAL_SHARE


def group_spread(rewards: list[float], size: int) -> tuple[int, int, float, float]:
    """Of total rewards in consecutive groups of `size` (GRPO's layout): the groups, those
    whose standard deviation is at most :data:`SPREAD_FLOOR`, the mean standard deviation
    within a group and the standard deviation of the groups' means (population, as a share of
    the reward's own scale they are comparable). NaN rewards (no reward applied) are left out.

    >>> group_spread([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], 2)
    (3, 2, 0.1667, 0.2357)
    """
    groups = [rewards[k : k + size] for k in range(0, len(rewards), size)]
    spreads, means = [], []
    for group in groups:
        values = [r for r in group if not math.isnan(r)]
        mean = sum(values) / len(values) if values else 0.0
        spread = math.sqrt(sum((r - mean) ** 2 for r in values) / len(values)) if values else 0.0
        spreads.append(spread)
        means.append(mean)
    center = sum(means) / len(means) if means else 0.0
    between = math.sqrt(sum((m - center) ** 2 for m in means) / len(means)) if means else 0.0
    zero = sum(s <= SPREAD_FLOOR for s in spreads)
    within = sum(spreads) / len(spreads) if spreads else 0.0
    return len(groups), zero, round(within, 4), round(between, 4)


def thoughts(texts: list[str]) -> tuple[int, int]:
    """Replies with a non-empty ``<think>`` and their thoughts' characters.

    >>> thoughts(["<think></think><answer>1</answer>", "<think> slant </think>", "2"])
    (1, 5)
    >>> thoughts(["slant</think><answer>1</answer>"])  # the prompt opened it
    (1, 5)
    """
    found = [m.group(1).strip() for m in map(THOUGHT.search, map(opened, texts)) if m]
    return sum(bool(t) for t in found), sum(len(t) for t in found)


def thought_tags(texts: list[str]) -> int:
    """Replies with a ``<think>`` tag at all, empty or not (a task whose replies have none,
    the summarizer's, has no thought to speak of).

    >>> thought_tags(["<think></think><answer>1</answer>", "<keep>[a]</keep>"])
    1
    """
    return sum(bool(THOUGHT.search(opened(text))) for text in texts)


class RLSignal(TrainerCallback):
    """Per step, how much GRPO's rewards spread within groups (module docstring); the
    no-signal guard (`guard`: ``warn`` or ``stop`` after `patience` steps without signal)."""

    def __init__(self, guard: str = "warn", patience: int = 4):
        self.guard, self.patience = guard, patience
        self.steps: list[Step] = []
        self.pending: list[tuple] = []  # (groups, zero, within, between, thought counts, weight)
        self.logged = 0  # steps already put into a log
        self.stopped_at: int | None = None
        self.warned = False
        # GRAIL's discriminator callback (grail.train.gail.DiscriminatorCallback), whose
        # pre-training record says why a learnable weight starts at 0
        self.discriminator = None

    def observe(self, rewards: list[float], size: int, replies: int, thought: tuple, weight):
        """One generation batch's total rewards (every process's), in groups of `size`; its
        `replies`, of which ``thought = (with a thought, their characters[, with a <think>
        tag])``; GAIL's weight."""
        with_thought, chars, *tagged = thought
        tags = tagged[0] if tagged else replies
        self.pending.append(
            (*group_spread(rewards, size), replies, with_thought, chars, weight, tags)
        )

    def on_step_end(self, args, state, control, **kwargs):
        if not self.pending:
            return
        groups = sum(p[0] for p in self.pending)
        replies = sum(p[4] for p in self.pending)
        with_thought = sum(p[5] for p in self.pending)
        step = Step(
            step=state.global_step,
            groups=groups,
            zero_spread=sum(p[1] for p in self.pending),
            within_std=sum(p[2] * p[0] for p in self.pending) / groups,
            between_std=sum(p[3] * p[0] for p in self.pending) / groups,
            thought_share=with_thought / replies if replies else 0.0,
            thought_chars=sum(p[6] for p in self.pending) / with_thought if with_thought else 0.0,
            gail_weight=self.pending[-1][7],
            tagged_share=sum(p[8] for p in self.pending) / replies if replies else 1.0,
        )
        self.pending.clear()
        self.steps.append(step)
        streak = 0
        for past in reversed(self.steps):
            if past.has_signal:
                break
            streak += 1
        if streak < self.patience:
            self.warned = False
            return
        if self.guard == "stop":
            self.stopped_at = state.global_step
            control.should_training_stop = True
            logger.warning(self.stop_line(streak))
        elif not self.warned:
            self.warned = True
            logger.warning(self.stop_line(streak))

    def stop_line(self, streak: int) -> str:
        last = self.steps[-streak:]
        zero, groups = sum(s.zero_spread for s in last), sum(s.groups for s in last)
        action = (
            "training stopped; the result is the start model (rl_signal_guard: stop)"
            if self.guard == "stop"
            else "the policy moves by its KL term alone (rl_signal_guard: stop ends such a run)"
        )
        return (
            f"step {last[-1].step}: RL had no signal for {streak} steps in a row: {zero} of "
            f"{groups} groups had equal rewards{self.why(last)}; {action}"
        )

    @staticmethod
    def why(steps: list[Step]) -> str:
        """Why, when it shows: a policy that writes no thought gives a score of its choice
        distribution nothing to differ by."""
        share = sum(s.thought_share for s in steps) / len(steps)
        tagged = sum(s.tagged_share for s in steps) / len(steps)
        return "; the policy writes no thought" if share < 0.05 <= tagged else ""

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The steps since the last log, averaged, into the log (before MLflow's callback
        sees it: this callback is inserted first)."""
        fresh = self.steps[self.logged :]
        if logs is None or not fresh or any(k.startswith("eval_") for k in logs):
            return
        self.logged = len(self.steps)
        logs["rl/zero_spread_share"] = sum(s.zero_share for s in fresh) / len(fresh)
        logs["rl/within_group_std"] = sum(s.within_std for s in fresh) / len(fresh)
        logs["rl/between_group_std"] = sum(s.between_std for s in fresh) / len(fresh)
        logs["rl/thought_share"] = sum(s.thought_share for s in fresh) / len(fresh)
        logs["rl/thought_chars"] = sum(s.thought_chars for s in fresh) / len(fresh)
        if fresh[-1].gail_weight is not None:
            logs["rl/gail_weight"] = fresh[-1].gail_weight

    def on_train_end(self, args, state, control, **kwargs):
        """The verdict as the ``rl_signal`` tag of the active MLflow run (this callback runs
        before transformers' MLflow callback, which may end the run)."""
        import sys

        verdict = self.verdict()
        if not state.is_world_process_zero or verdict is None or "mlflow" not in sys.modules:
            return
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.set_tag(TAG, verdict)

    def verdict(self) -> str | None:
        """The run's RL signal in one sentence (None before any step).

        >>> signal = RLSignal()
        >>> signal.steps = [Step(1, 64, 63, 0.0, 0.3, 0.0, 0.0), Step(2, 64, 64, 0.0, 0.3, 0.0, 0.0)]
        >>> signal.verdict()
        'RL had no signal: 127 of 128 groups had equal rewards over 2 steps; the policy writes no thought'
        """  # noqa: E501 (the sentence as printed)
        if not self.steps:
            return None
        zero, groups = sum(s.zero_spread for s in self.steps), sum(s.groups for s in self.steps)
        share = zero / groups if groups else 1.0
        words = (
            "no signal"
            if share >= NO_SIGNAL_SHARE
            else "little signal"
            if share >= 0.5
            else "signal"
        )
        within = sum(s.within_std for s in self.steps) / len(self.steps)
        sentence = (
            f"RL had {words}: {zero} of {groups} groups had equal rewards over "
            f"{len(self.steps)} steps"
        )
        if words != "no signal":
            sentence += f" (mean within-group reward std {within:.3g})"
        thought = sum(s.thought_share for s in self.steps) / len(self.steps)
        tagged = sum(s.tagged_share for s in self.steps) / len(self.steps)
        if tagged < 0.05:  # the task's replies have no thought tag (the summarizer's)
            pass
        elif thought < 0.05:
            sentence += "; the policy writes no thought"
        else:
            sentence += f"; {thought:.0%} of replies have a thought"
        weights = [s.gail_weight for s in self.steps if s.gail_weight is not None]
        if weights:
            sentence += (
                f"; GAIL's weight {weights[0]:.3g} at step 1{self.why_no_weight(weights[0])}, "
                f"{weights[-1]:.3g} at the last"
            )
        if self.stopped_at is not None:
            sentence += f"; stopped at step {self.stopped_at} (rl_signal_guard: stop)"
        return sentence

    def why_no_weight(self, first: float) -> str:
        """Why GAIL's learnable weight was 0 at step 1, when the discriminator's pre-training
        says: its balanced accuracy on the held-out prompts' pairs, which set that weight
        (:meth:`grail.train.gail.Judgement.edge`: 0 unless it beats chance by a standard error).

        >>> from types import SimpleNamespace
        >>> signal = RLSignal()
        >>> signal.discriminator = SimpleNamespace(
        ...     pretrained={"held_out_pairs": 120, "held_out_balanced_accuracy": 0.452})
        >>> signal.why_no_weight(0.0)
        ' (after pre-training, its balanced accuracy on 120 held-out pairs was 0.452: not above chance by a standard error)'
        >>> signal.why_no_weight(0.008), RLSignal().why_no_weight(0.0)
        ('', '')
        """  # noqa: E501 (the clause as printed)
        pretrained = getattr(self.discriminator, "pretrained", None) or {}
        accuracy = pretrained.get("held_out_balanced_accuracy")
        if first != 0 or accuracy is None:
            return ""
        return (
            f" (after pre-training, its balanced accuracy on {pretrained['held_out_pairs']} "
            f"held-out pairs was {accuracy:.3g}: not above chance by a standard error)"
        )

    def record(self) -> dict:
        """For ``summary.json``: the verdict and each step's figures."""
        return {
            "rl_signal": self.verdict(),
            "rl_signal_stopped_at": self.stopped_at,
            "rl_signal_steps": [
                {**s.__dict__, "zero_share": round(s.zero_share, 4)} for s in self.steps
            ],
        }
