"""GRAIL: a GAIL-style discriminator reward composed with TRL's ``GRPOTrainer``.

- :class:`Discriminator` wraps a small sequence classifier (one logit) that scores
  P(real | viewer state, chosen option): the text is ``CHOSEN <option line>`` followed by the
  prompt without its OPTIONS block.
- :class:`DiscriminatorReward` is a TRL reward function: ``alpha * P(real)`` for a valid answer, 0
  otherwise. During training it queues the gold choice of each prompt (label 1) and every valid
  policy choice that differs from the gold (label 0).
- :class:`DiscriminatorCallback` moves the queued pairs into a :class:`ReplayBuffer` after each
  step, runs ``gail_updates_per_step`` minibatch updates (half real, half policy), and with
  ``gail_learnable_weight`` adapts the mixing weight inside the trainer's ``reward_weights``.
- Evaluation: the discriminator is frozen (scores, no updates, no buffer) or, with
  ``gail_eval_mode: off``, gives no reward.

Several processes (``accelerate launch``): every process holds a replica of the discriminator.
The pairs queued in each process are all-gathered before they enter the buffer, and minibatches
are drawn with the same seed everywhere, so every replica takes the same updates and the replicas
stay identical without a gradient all-reduce. The metrics logged are those of the local replica.
"""

from __future__ import annotations

import random
from collections import deque

import torch
from transformers import TrainerCallback

from grail.errors import GrailError
from grail.rewards import completion_text, parse_answer

OPTIONS_HEADER = "\n\nOPTIONS\n"


def choice_text(prompt, option: int) -> str | None:
    """Discriminator input: the chosen option, then the viewer state (the prompt without OPTIONS).

    >>> text = "VIEWER\\nage 30\\n\\nOPTIONS\\n1. A (from X)\\n2. B"
    >>> prompt = [{"role": "user", "content": text}]
    >>> choice_text(prompt, 2)
    'CHOSEN B\\n\\nVIEWER\\nage 30'
    >>> choice_text(prompt, 3) is None
    True
    """
    user = (
        prompt
        if isinstance(prompt, str)
        else next(m["content"] for m in reversed(prompt) if m["role"] == "user")
    )
    state, _, options = user.partition(OPTIONS_HEADER)
    lines = options.split("\n") if options else []
    if not 1 <= option <= len(lines):
        return None
    return f"CHOSEN {lines[option - 1].split('. ', 1)[-1]}\n\n{state}"


def resolve_device(name: str) -> torch.device:
    """``auto`` is this process's accelerator (accelerate's view), else the device named."""
    if name == "auto":
        from accelerate import PartialState

        return PartialState().device
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GrailError(f"gail_device {name!r}: no CUDA device is available here")
    return device


class Discriminator:
    """A sequence classifier with one logit, trained with BCE (real = 1, policy = 0)."""

    def __init__(self, model: str, device: str = "auto", lr: float = 2e-5, max_length: int = 512):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.max_length = max_length

    def _logits(self, texts: list[str]) -> torch.Tensor:
        batch = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
        ).to(self.device)
        return self.model(**batch).logits[:, 0].float()

    @torch.no_grad()
    def p_real(self, texts: list[str]) -> list[float]:
        if not texts:
            return []
        self.model.eval()
        return torch.sigmoid(self._logits(texts)).tolist()

    def update(self, texts: list[str], labels: list[float]) -> tuple[float, float]:
        """One optimizer step on a minibatch; returns (loss, accuracy) on it."""
        self.model.train()
        logits = self._logits(texts)
        target = torch.tensor(labels, device=logits.device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        accuracy = ((logits > 0).float() == target).float().mean()
        return loss.item(), accuracy.item()


class ReplayBuffer:
    """The last `capacity` (text, label) pairs; balanced, seeded minibatches.

    >>> buffer = ReplayBuffer(capacity=3, seed=0)
    >>> buffer.extend([("a", 1.0), ("b", 0.0), ("c", 0.0), ("d", 0.0)])
    >>> len(buffer), sorted(label for _, label in buffer.sample(4))
    (3, [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, capacity: int, seed: int = 0):
        self.pairs: deque[tuple[str, float]] = deque(maxlen=capacity)
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.pairs)

    def extend(self, pairs) -> None:
        self.pairs.extend(pairs)

    def sample(self, size: int) -> list[tuple[str, float]]:
        """Half real and half policy pairs when both exist (drawn with replacement)."""
        real = [p for p in self.pairs if p[1] == 1.0]
        fake = [p for p in self.pairs if p[1] == 0.0]
        if not real or not fake:
            pool = real or fake
            return [self.rng.choice(pool) for _ in range(size)] if pool else []
        half = size // 2
        return [self.rng.choice(real) for _ in range(size - half)] + [
            self.rng.choice(fake) for _ in range(half)
        ]


class DiscriminatorReward:
    """TRL reward function: ``alpha * P(real)`` of the chosen option; 0 for an invalid answer."""

    __name__ = "discriminator"

    def __init__(self, discriminator: Discriminator, alpha: float = 1.0, eval_mode: str = "frozen"):
        self.discriminator = discriminator
        self.alpha = alpha
        self.eval_mode = eval_mode
        self.policy: torch.nn.Module | None = None  # bound by the callback at train begin
        self.pending: list[tuple[str, float]] = []
        self.stats: dict[str, float] = {}

    @property
    def training(self) -> bool:
        return self.policy is None or self.policy.training

    def __call__(
        self, prompts, completions, gold_index, n_options=None, log_metric=None, **_
    ) -> list[float | None]:
        if not self.training and self.eval_mode == "off":
            return [None] * len(completions)
        sizes = n_options if n_options is not None else [None] * len(completions)
        answers = [
            parse_answer(completion_text(c), n) for c, n in zip(completions, sizes, strict=True)
        ]
        texts = [choice_text(p, a) if a else None for p, a in zip(prompts, answers, strict=True)]
        scores = iter(self.discriminator.p_real([t for t in texts if t]))
        rewards = [self.alpha * next(scores) if t else 0.0 for t in texts]
        if self.training:
            seen = set()
            for prompt, answer, gold, text in zip(prompts, answers, gold_index, texts, strict=True):
                real = choice_text(prompt, gold)
                if real and real not in seen:
                    seen.add(real)
                    self.pending.append((real, 1.0))
                if text and answer != gold:
                    self.pending.append((text, 0.0))
        if log_metric is not None:
            valid = [r for r, t in zip(rewards, texts, strict=True) if t]
            if valid:
                log_metric("gail/p_real", sum(valid) / len(valid) / (self.alpha or 1.0))
            for name, value in self.stats.items():
                log_metric(name, value)
        return rewards


class DiscriminatorCallback(TrainerCallback):
    """Trains the discriminator from the replay buffer after every step; adapts the mix weight."""

    def __init__(
        self,
        reward: DiscriminatorReward,
        buffer: ReplayBuffer,
        minibatch: int,
        updates_per_step: int,
        reward_weights: torch.Tensor | None = None,
        learnable_weight: bool = False,
        max_weight: float = 0.5,
    ):
        self.reward, self.buffer = reward, buffer
        self.minibatch, self.updates_per_step = minibatch, updates_per_step
        self.reward_weights = reward_weights  # the trainer's tensor; last entry is the disc's
        self.base = None if reward_weights is None else reward_weights[:-1].clone()
        self.learnable_weight, self.max_weight = learnable_weight, max_weight
        self.weight = max_weight
        self.updates = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.reward.policy = model

    def _gather(self, pairs: list) -> list:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from accelerate.utils import gather_object

            return gather_object(pairs)
        return pairs

    def set_weight(self, weight: float) -> None:
        """Write the mixing weight into the trainer's reward weights (base scaled by 1 - w)."""
        self.weight = weight
        if self.reward_weights is not None:
            self.reward_weights[:-1] = self.base * (1.0 - weight) / self.base.sum()
            self.reward_weights[-1] = weight

    def on_step_end(self, args, state, control, **kwargs):
        self.buffer.extend(self._gather(self.reward.pending))
        self.reward.pending.clear()
        losses, accuracies = [], []
        for _ in range(self.updates_per_step):
            batch = self.buffer.sample(self.minibatch)
            if not batch:
                break
            loss, accuracy = self.reward.discriminator.update(*map(list, zip(*batch, strict=True)))
            losses.append(loss)
            accuracies.append(accuracy)
            self.updates += 1
        if losses:
            accuracy = sum(accuracies) / len(accuracies)
            if self.learnable_weight:
                target = self.max_weight * min(max(2 * accuracy - 1, 0.0), 1.0)
                self.set_weight(self.weight + 0.1 * (target - self.weight))
            self.reward.stats = {
                "gail/disc_loss": sum(losses) / len(losses),
                "gail/disc_accuracy": accuracy,
                "gail/weight": self.weight,
                "gail/buffer_size": float(len(self.buffer)),
            }
