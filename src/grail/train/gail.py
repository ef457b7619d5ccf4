"""GRAIL: a GAIL-style discriminator reward composed with TRL's ``GRPOTrainer``.

- :class:`Discriminator` wraps a small sequence classifier (one logit) that scores
  D = P(real | viewer state, chosen option): the text (the task's ``discriminator_text``) is
  ``CHOSEN <option line>`` (the option's number, its position on the slate, included), then
  the prompt without its OPTIONS block, then by default (``gail_context: slate``) the whole
  slate it was chosen from.
- :class:`DiscriminatorReward` is a TRL reward function, GAIL's distribution-matching reward
  ``alpha * (log D - log(1 - D))``, the discriminator's logit clipped to +-:data:`LOGIT_CLIP`;
  a reply naming no option of its slate is no negative and gets its group's mean
  (:func:`neutral_for_invalid`: the format reward judges it). During training it queues the
  gold choice of each prompt (label 1) and every valid policy choice (label 0), the gold one
  included: against an optimal discriminator D = p / (p + pi) the expected reward is
  -KL(pi || p), maximised only at pi = p, people's own distribution (:func:`gail_reward`).
  Counting only choices that differ from the gold as fake, as upstream did, makes the reward a
  learned accuracy reward: mode-seeking.
- :class:`DiscriminatorCallback` first pre-trains the discriminator against the start model's
  own samples (:class:`Pretraining`), so that step 1's rewards are not an untrained
  classifier's noise; after each step it moves the queued pairs into a :class:`ReplayBuffer`
  and runs ``gail_updates_per_step`` minibatch updates (half real, half policy). With
  ``gail_learnable_weight`` the mixing weight inside the trainer's ``reward_weights`` follows
  the discriminator's balanced accuracy on pairs it has not trained on (:class:`Judgement`:
  held-out prompts after pre-training, then each step's fresh pairs before they enter the
  buffer, :func:`next_weight`), so a discriminator at chance gets no say whatever its bias.
  Every checkpoint gets ``discriminator/`` (weights, optimizer, buffer, weight); a resumed run
  restores it (and does not pre-train again).
- The discriminator is loaded whole and in fp32 even when the trainer runs DeepSpeed ZeRO-3
  (:func:`grail.train.overrides.outside_zero3`): each process keeps a full replica, and bf16
  updates at lr 2e-5 would round away.
- Evaluation: the discriminator is frozen (scores, no updates, no buffer) or, with
  ``gail_eval_mode: off``, gives no reward.

Several processes (``accelerate launch``): every process holds a replica of the discriminator.
The pairs queued in each process are all-gathered before they enter the buffer, and minibatches
are drawn with the same seed everywhere, so every replica takes the same updates and the replicas
stay identical without a gradient all-reduce. The metrics logged are those of the local replica.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

from grail.core.errors import GrailError
from grail.core.outputs import replace_text
from grail.core.rewards import completion_text
from grail.tasks import DEFAULT_TASK, TASKS
from grail.train.overrides import outside_zero3
from grail.train.sampling import sample_replies

LOGIT_CLIP = 5.0  # |log D - log(1 - D)| at most: D within [0.0067, 0.9933]


def gail_reward(logit: float, alpha: float = 1.0) -> float:
    """GAIL's distribution-matching reward from the discriminator's logit:
    ``alpha * (log D - log(1 - D))`` (the logit itself), clipped to +-:data:`LOGIT_CLIP`.

    >>> gail_reward(0.0), gail_reward(-12.0), gail_reward(1.5, alpha=2.0)
    (0.0, -5.0, 3.0)
    """
    return alpha * min(max(logit, -LOGIT_CLIP), LOGIT_CLIP)


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

    def __init__(
        self,
        model: str,
        device: str = "auto",
        lr: float = 2e-5,
        max_length: int = 512,
        max_grad_norm: float = 1.0,
        weight_decay: float = 0.01,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        with outside_zero3():
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model, num_labels=1, dtype=torch.float32
            )
        if self.tokenizer.pad_token is None:  # causal-LM tokenizers often have none
            if self.tokenizer.eos_token is not None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            else:
                self.tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
                self.model.resize_token_embeddings(len(self.tokenizer))
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=weight_decay
        )
        self.max_length = max_length
        self.max_grad_norm = max_grad_norm
        self.chunk = 32  # texts per scoring forward pass

    def _logits(self, texts: list[str]) -> torch.Tensor:
        batch = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
        ).to(self.device)
        # bf16 autocast on CUDA: half the activation memory of the minibatch's backward pass;
        # the fp32 weights and optimizer stay as they are (updates at lr 2e-5 need them)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            return self.model(**batch).logits[:, 0].float()

    @torch.no_grad()
    def logits(self, texts: list[str]) -> list[float]:
        """log D - log(1 - D) of each text, scored `chunk` texts at a time (every rank's
        gathered pairs in one forward pass would hold all their activations at once on a GPU
        beside vLLM)."""
        if not texts:
            return []
        self.model.eval()
        scores = []
        for start in range(0, len(texts), self.chunk):
            scores += self._logits(texts[start : start + self.chunk]).tolist()
        return scores

    def p_real(self, texts: list[str]) -> list[float]:
        """D = P(real) of each text."""
        return torch.sigmoid(torch.tensor(self.logits(texts), dtype=torch.float64)).tolist()

    def judged(
        self, pairs: list[tuple[str, float]], known: dict[str, float] | None = None
    ) -> Judgement | None:
        """How well it tells the `pairs` apart (:class:`Judgement`); None without pairs.
        `known`: P(real) of texts this discriminator, unchanged since, has scored already (the
        reward's scores of the step's replies); every other text is scored once."""
        if not pairs:
            return None
        scores = dict(known or {})
        unscored = list(dict.fromkeys(text for text, _ in pairs if text not in scores))
        scores.update(zip(unscored, self.p_real(unscored), strict=True))
        return Judgement.of([(scores[text], label) for text, label in pairs])

    def update(self, texts: list[str], labels: list[float]) -> tuple[float, float]:
        """One optimizer step on a minibatch; returns (loss, accuracy) on it."""
        self.model.train()
        logits = self._logits(texts)
        target = torch.tensor(labels, device=logits.device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        self.optimizer.zero_grad()
        loss.backward()
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        accuracy = ((logits > 0).float() == target).float().mean()
        return loss.item(), accuracy.item()

    def broadcast_weights(self) -> None:
        """Rank 0's weights to every replica after an update. Identical updates keep the
        replicas equal on CPU, but CUDA's nondeterministic kernels (atomics in the backward
        pass) let them drift apart; one broadcast per step pins them together."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        for tensor in self.model.state_dict().values():
            if tensor.device.type == "cpu" and dist.get_backend() == "nccl":
                continue  # NCCL moves device tensors only; non-parameter CPU buffers stay
            dist.broadcast(tensor, src=0)

    def sha256(self) -> str:
        """A digest of the weights: equal on every rank when the replicas agree."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def save(self, folder: Path) -> None:
        self.model.save_pretrained(folder / "model")
        self.tokenizer.save_pretrained(folder / "model")
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(folder / "model" / "model.safetensors"))
        self.optimizer.load_state_dict(
            torch.load(folder / "optimizer.pt", map_location=self.device, weights_only=True)
        )


FEATURE_BUCKETS = 2**18  # hashed features of the feature discriminator


class FeatureDiscriminator(Discriminator):
    """A logistic regression on the task's features of the text (``gail_discriminator:
    features``; `features`, the task's ``discriminator_features``: the slate task's
    :func:`grail.tasks.slate.discriminator.crossed_features`): one weight per hashed feature
    and a bias, trained by the same BCE updates and AdamW (its weight decay the
    regularisation). It reads the same text as the classifier but learns interactions of the
    viewer and the choice from a few hundred pairs, where a transformer trained from scratch
    stays at chance (docs/training.md#grail-the-discriminator-reward)."""

    def __init__(self, features: Callable[[str], list[str]], device: str = "cpu",
                 lr: float = 0.01, max_grad_norm: float = 0.0,
                 weight_decay: float = 1.0):  # fmt: skip
        # a text's features' buckets, by a stable hash (Python's own is salted per process,
        # and every rank's replica must read a text alike); cached: the replay buffer's texts
        # are drawn again and again
        self.text_buckets = functools.lru_cache(maxsize=16384)(
            lambda text: tuple(zlib.crc32(f.encode()) % FEATURE_BUCKETS for f in features(text))
        )
        self.device = resolve_device(device)
        self.model = torch.nn.EmbeddingBag(FEATURE_BUCKETS, 1, mode="sum").to(self.device)
        torch.nn.init.zeros_(self.model.weight)
        self.bias = torch.nn.Parameter(torch.zeros(1, device=self.device))
        self.model.register_parameter("bias", self.bias)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=weight_decay
        )
        self.max_grad_norm = max_grad_norm
        self.chunk = 256

    def _logits(self, texts: list[str]) -> torch.Tensor:
        buckets = [self.text_buckets(t) for t in texts]
        offsets = torch.tensor([0] + [len(b) for b in buckets[:-1]]).cumsum(0)
        flat = torch.tensor([k for b in buckets for k in b], dtype=torch.long)
        # each text's features scaled to unit length: a text of 600 crosses would otherwise
        # move its logit 600 times as far per update as a text of one
        scale = torch.cat([torch.full((len(b),), len(b) ** -0.5) for b in buckets])
        scores = self.model(
            flat.to(self.device), offsets.to(self.device), per_sample_weights=scale.to(self.device)
        )
        return scores[:, 0] + self.bias

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), folder / "features.pt")
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        self.model.load_state_dict(
            torch.load(folder / "features.pt", map_location=self.device, weights_only=True)
        )
        self.optimizer.load_state_dict(
            torch.load(folder / "optimizer.pt", map_location=self.device, weights_only=True)
        )


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

    def state(self) -> dict:
        return {"pairs": list(self.pairs), "rng": self.rng.getstate()}

    def restore(self, state: dict) -> None:
        self.pairs.clear()
        self.pairs.extend((text, float(label)) for text, label in state["pairs"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

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


def neutral_for_invalid(prompts, rewards: list[float | None]) -> list[float | None]:
    """A reply that names no option of its slate (None) gets the mean reward of its prompt's
    valid replies: the discriminator neither punishes it (that is the format reward's part,
    and a floor of -5 for ~18% of replies was the only large difference a discriminator at
    chance made) nor pays it more than the group's average (0 would beat every reply it
    judged fake). None when no reply of the prompt is valid.

    >>> neutral_for_invalid(["a", "a", "a", "b"], [1.0, None, -3.0, None])
    [1.0, -1.0, -3.0, None]
    """
    valid: dict[str, list[float]] = {}
    for prompt, reward in zip(prompts, rewards, strict=True):
        if reward is not None:
            valid.setdefault(repr(prompt), []).append(reward)
    mean = {key: sum(values) / len(values) for key, values in valid.items()}
    return [
        reward if reward is not None else mean.get(repr(prompt))
        for prompt, reward in zip(prompts, rewards, strict=True)
    ]


class DiscriminatorReward:
    """TRL reward function: :func:`gail_reward` of the chosen option; a reply that names no
    option of its slate is neither a negative nor scored (:func:`neutral_for_invalid`). The
    task says which option a reply names (its ``reply_choice``) and what the discriminator
    reads of it (its ``discriminator_text``)."""

    __name__ = "discriminator"

    def __init__(
        self,
        discriminator: Discriminator,
        alpha: float = 1.0,
        eval_mode: str = "frozen",
        context: str = "slate",
        task: str = DEFAULT_TASK,
    ):
        if not TASKS[task].gail:
            raise GrailError(f"gail_use: the {task} task has no discriminator (GRPO only)")
        self.reply_choice = TASKS[task].reply_choice
        self.discriminator_text = TASKS[task].discriminator_text
        self.discriminator = discriminator
        self.context = context
        self.alpha = alpha
        self.eval_mode = eval_mode
        self.policy: torch.nn.Module | None = None  # bound by the callback at train begin
        self.pending: list[tuple[str, float]] = []
        self.scored: dict[str, float] = {}  # P(real) of the pending replies, as rewarded
        self.stats: dict[str, float] = {}

    @property
    def training(self) -> bool:
        return self.policy is None or self.policy.training

    def text(self, prompt, option: int | None) -> str | None:
        """What the discriminator reads of `option` chosen in `prompt`; None for no option, or
        one the prompt does not show."""
        return self.discriminator_text(prompt, option, self.context) if option else None

    def __call__(
        self, prompts, completions, gold_index, n_options=None, log_metric=None, **_
    ) -> list[float | None]:
        if not self.training and self.eval_mode == "off":
            return [None] * len(completions)
        sizes = n_options if n_options is not None else [None] * len(completions)
        answers = [
            self.reply_choice(completion_text(c), n)
            for c, n in zip(completions, sizes, strict=True)
        ]
        texts = [self.text(p, a) for p, a in zip(prompts, answers, strict=True)]
        replies = [t for t in texts if t]
        logits = self.discriminator.logits(replies)
        given = iter(logits)
        rewards = [gail_reward(next(given), self.alpha) if t else None for t in texts]
        rewards = neutral_for_invalid(prompts, rewards)
        scores = torch.sigmoid(torch.tensor(logits, dtype=torch.float64)).tolist()
        if self.training:
            self.scored.update(zip(replies, scores, strict=True))
            seen = set()
            for prompt, gold, text in zip(prompts, gold_index, texts, strict=True):
                real = self.text(prompt, gold)
                if real and real not in seen:
                    seen.add(real)
                    self.pending.append((real, 1.0))
                if text:  # every policy sample, the gold choice too: GAIL's fixed point pi = p
                    self.pending.append((text, 0.0))
        if log_metric is not None and scores:
            log_metric("gail/p_real", sum(scores) / len(scores))
            for name, value in self.stats.items():
                log_metric(name, value)
        return rewards


@dataclass(frozen=True)
class Judgement:
    """A discriminator's record on pairs it has not trained on: the share of real pairs it
    calls real (``real_right``), of policy pairs it calls policy (``policy_right``), and their
    counts. Plain accuracy would reward its bias: on 32 real to 53 policy pairs one that calls
    everything "policy" scores 53/85 = 0.62 and learns nothing; balanced accuracy, the mean of
    the two shares, is 0.5 for it whatever the class balance.

    >>> Judgement.of([(0.3, 1.0)] * 32 + [(0.3, 0.0)] * 53).balanced_accuracy
    0.5
    >>> Judgement.of([(0.9, 1.0)] * 3 + [(0.1, 0.0)] * 2).edge()
    1.0
    """

    real_right: float
    policy_right: float
    real: int
    policy: int

    @classmethod
    def of(cls, scored: list[tuple[float, float]]) -> Judgement | None:
        """From (P(real), label) pairs; None unless both classes are present."""
        real = [p > 0.5 for p, label in scored if label == 1.0]
        policy = [p <= 0.5 for p, label in scored if label == 0.0]
        if not real or not policy:
            return None
        return cls(sum(real) / len(real), sum(policy) / len(policy), len(real), len(policy))

    @property
    def balanced_accuracy(self) -> float:
        return (self.real_right + self.policy_right) / 2

    def edge(self) -> float:
        """How far beyond chance it tells people from the policy, in [0, 1]: ``2 * (balanced
        accuracy - one standard error) - 1``, clipped. The standard error keeps a discriminator
        whose balanced accuracy is above 0.5 by sampling noise alone near 0 (on 32:53 pairs a
        random one's is 0.5 +- 0.056).

        >>> round(Judgement(0.75, 0.75, 400, 400).edge(), 3), Judgement(0.5, 0.5, 32, 53).edge()
        (0.469, 0.0)
        """
        error = 0.5 * math.sqrt(
            self.real_right * (1 - self.real_right) / self.real
            + self.policy_right * (1 - self.policy_right) / self.policy
        )
        return min(max(2 * (self.balanced_accuracy - error) - 1, 0.0), 1.0)


def next_weight(
    weight: float, judged: Judgement | None, ceiling: float, rate: float = 0.1
) -> float:
    """The adapted mixing weight after a step: a `rate` of the way toward
    ``ceiling * judged.edge()``; unchanged without fresh pairs of both kinds to judge by.

    A discriminator at chance, whatever its bias, pulls the weight to 0: its reward would be
    noise. One that tells every policy choice from the gold pulls it to the ceiling.

    >>> perfect, chance = Judgement(1.0, 1.0, 32, 53), Judgement(1.0, 0.0, 32, 53)
    >>> next_weight(0.0, perfect, 0.5)
    0.05
    >>> next_weight(0.3, chance, 0.5), next_weight(0.3, None, 0.5)
    (0.27, 0.3)
    """
    if judged is None:
        return weight
    return round(weight + rate * (ceiling * judged.edge() - weight), 12)


@dataclass
class Pretraining:
    """What the discriminator learns before the first RL step: people's choices (real) against
    the start model's own sampled replies (policy) on `rows` ((prompt, gold_index, n_options)
    of the train split), `updates` balanced minibatch updates; every ``held_out``-th prompt's
    pairs are kept out of them to judge it by (:class:`Judgement`), which sets the learnable
    weight of step 1. Sampled as GRPO samples: `temperature`, `max_new_tokens`."""

    rows: list[tuple]
    updates: int
    max_new_tokens: int
    temperature: float = 1.0
    batch: int = 32
    held_out: int = 4


class DiscriminatorCallback(TrainerCallback):
    """Pre-trains the discriminator against the start model's samples (:class:`Pretraining`),
    trains it from the replay buffer after every step, adapts the mix weight; saves and
    restores it with the trainer's checkpoints."""

    def __init__(
        self,
        reward: DiscriminatorReward,
        buffer: ReplayBuffer,
        minibatch: int,
        updates_per_step: int,
        reward_weights: torch.Tensor | None = None,
        base_weights: list[float] | None = None,
        learnable_weight: bool = False,
        max_weight: float = 0.5,
        restore_from: str | None = None,
        pretraining: Pretraining | None = None,
    ):
        self.reward, self.buffer = reward, buffer
        self.minibatch, self.updates_per_step = minibatch, updates_per_step
        self.reward_weights = reward_weights  # the trainer's tensor; last entry is the disc's
        # The base rewards' own weights, normalized: the trainer's tensor holds them already
        # scaled by (1 - w), all zero when w = 1.
        base = base_weights or [1.0] * (0 if reward_weights is None else len(reward_weights) - 1)
        self.base = [w / sum(base) for w in base] if base and sum(base) > 0 else base
        self.learnable_weight, self.max_weight = learnable_weight, max_weight
        self.weight = 0.0 if learnable_weight else max_weight
        self.set_weight(self.weight)
        self.updates = 0
        self.restore_from = restore_from
        self.restored_from: str | None = None
        self.pretraining = pretraining
        self.pretrained: dict | None = None  # what pre-training measured (the run's summary)

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.reward.policy = model
        folder = Path(self.restore_from or "") / "discriminator"
        if self.restore_from and (folder / "state.json").is_file():
            self.load(folder)
            self.restored_from = str(folder)
        elif self.pretraining is not None and model is not None:
            self.pretrain(model, processing_class)

    def pretrain(self, model, tokenizer) -> None:
        """Learn people's choices against the start model's before step 1 (GAIL
        implementations pre-train the discriminator so that its first rewards are not noise);
        judge it on the held-out prompts' pairs, which set the learnable weight."""
        from accelerate import PartialState

        plan, process = self.pretraining, PartialState()
        count = len(plan.rows) - len(plan.rows) % process.num_processes  # the same on each rank
        mine = list(range(process.process_index, count, process.num_processes))
        rows = [plan.rows[k] for k in mine]
        replies = sample_replies(
            model,
            tokenizer,
            [r[0] for r in rows],
            plan.max_new_tokens,
            plan.temperature,
            plan.batch,
            "the start model's replies the discriminator pre-trains against",
        )
        tagged = []
        for k, (prompt, gold, size), reply in zip(mine, rows, replies, strict=True):
            held = k % plan.held_out == plan.held_out - 1
            chosen = self.reward.reply_choice(reply, size)
            for text, label in (
                (self.reward.text(prompt, gold), 1.0),
                (self.reward.text(prompt, chosen), 0.0),
            ):
                if text:
                    tagged.append((held, text, label))
        tagged = self._gather(tagged)
        held_out = [(text, label) for held, text, label in tagged if held]
        self.buffer.extend([(text, label) for held, text, label in tagged if not held])
        self.train_steps(plan.updates)
        judged = self.reward.discriminator.judged(held_out)
        if self.learnable_weight and judged is not None:
            self.set_weight(round(self.max_weight * judged.edge(), 12))
        self.buffer.extend(held_out)
        valid = sum(1 for _, _, label in tagged if label == 0.0)
        self.pretrained = {
            "prompts": count,
            "valid_policy_replies": valid,
            "updates": plan.updates,
            "held_out_pairs": len(held_out),
            "held_out_balanced_accuracy": judged and round(judged.balanced_accuracy, 4),
            "weight": round(self.weight, 6),
        }
        self.reward.stats = {"gail/weight": self.weight}
        if judged is not None:
            self.reward.stats["gail/fresh_balanced_accuracy"] = judged.balanced_accuracy

    def _gather(self, pairs: list) -> list:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from accelerate.utils import gather_object

            return gather_object(pairs)
        return pairs

    def set_weight(self, weight: float) -> None:
        """Write the mixing weight into the trainer's reward weights (base scaled by 1 - w)."""
        self.weight = weight
        if self.reward_weights is not None:
            for k, base in enumerate(self.base):
                self.reward_weights[k] = base * (1.0 - weight)
            self.reward_weights[-1] = weight

    def train_steps(self, updates: int) -> tuple[list[float], list[float]]:
        """`updates` balanced minibatch updates from the buffer (the replicas kept equal);
        returns their losses and accuracies."""
        losses, accuracies = [], []
        for _ in range(updates):
            batch = self.buffer.sample(self.minibatch)
            if not batch:
                break
            loss, accuracy = self.reward.discriminator.update(*map(list, zip(*batch, strict=True)))
            losses.append(loss)
            accuracies.append(accuracy)
            self.updates += 1
        if losses:
            self.reward.discriminator.broadcast_weights()
        return losses, accuracies

    def on_step_end(self, args, state, control, **kwargs):
        fresh = self._gather(list(self.reward.pending))
        scored, self.reward.scored = self.reward.scored, {}
        self.reward.pending.clear()
        # before it learns from them; the replies with the scores their reward was given
        judged = self.reward.discriminator.judged(fresh, scored)
        if self.learnable_weight:
            self.set_weight(next_weight(self.weight, judged, self.max_weight))
        self.buffer.extend(fresh)
        losses, accuracies = self.train_steps(self.updates_per_step)
        stats = {"gail/weight": self.weight, "gail/buffer_size": float(len(self.buffer))}
        if judged is not None:
            stats["gail/fresh_balanced_accuracy"] = judged.balanced_accuracy
        if losses:
            stats["gail/disc_loss"] = sum(losses) / len(losses)
            stats["gail/disc_accuracy"] = sum(accuracies) / len(accuracies)
        self.reward.stats = stats

    def on_save(self, args, state, control, **kwargs):
        """``discriminator/`` inside the checkpoint the trainer just wrote (before the upload
        callback, which the trainer runs after this one, snapshots it)."""
        if state.is_world_process_zero:
            self.save(Path(args.output_dir) / f"checkpoint-{state.global_step}" / "discriminator")

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.reward.discriminator.save(folder)
        replace_text(folder / "buffer.json", json.dumps(self.buffer.state()))
        state = {"weight": self.weight, "updates": self.updates}
        replace_text(folder / "state.json", json.dumps(state))

    def load(self, folder: Path) -> None:
        self.reward.discriminator.load(folder)
        self.buffer.restore(json.loads((folder / "buffer.json").read_text()))
        state = json.loads((folder / "state.json").read_text())
        self.updates = state["updates"]
        self.set_weight(state["weight"])
