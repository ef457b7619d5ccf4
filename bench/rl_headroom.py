"""What each RL reward could add to behaviour cloning at most, before anyone pays for RL.

Scored in expected log-loss under the synthetic study's true choice probabilities (no noise of
which option each person happened to click), paired with the cloned model on the same
validation rows (participant-bootstrap intervals):

(a) **The GAIL bound.** GAIL's reward moves the policy toward q * exp(logit D), D a
    discriminator of people's choices against the policy's; a discriminator trained to
    convergence on the cloned model's own samples gives the most that move could be. Three
    discriminators: grail's tiny sequence classifier (``gail_discriminator: classifier``,
    fresh, ``--updates`` balanced minibatch updates on the viewer, the slate and the chosen
    option, as GRAIL reads them), grail's features discriminator (``gail_discriminator:
    features``, the demo's, 200 updates of 16 on the same texts) and, as the informative
    reference, a logistic regression on the ranker's features (viewer x channel and title
    words, position, popularity). Each learns
    from three quarters of the train rows' pairs (the person's choice, one draw from the
    cloned model) and has its logits' temperature fitted on the last quarter (a logit is the
    density ratio GAIL moves by only once calibrated); each also gets its balanced accuracy on
    the validation rows' pairs (what its GRAIL weight would be set from).
(b) **The log-score bound.** The log score scores q after the completion's thought, so RL can
    move only as far as sampled thoughts differ: ``--k`` completions per validation row from
    the cloned model (its sampling settings), the log score of q after each; the share of rows
    whose K scores are equal (within 1e-3: :data:`grail.train.rl_signal.SPREAD_FLOOR`), the
    mean within-row standard deviation, and best-of-K's expected log-loss (an oracle that
    picks the best thought per row: no policy can beat it).

Defaults: the demo's study (1,500 participants, one issue), the tiny policy cloned with
``recipes/tiny/config_bc.yaml``. Reuses ``--out``'s folders when they are complete.

Run: ``.venv/bin/python bench/rl_headroom.py [--out rl_headroom_outputs] [--updates 800]``
(``--cloned MODEL --clean DATA --discriminator TINY_CLASSIFIER`` score other models).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prepared(out: Path, issue: str, participants: int) -> tuple[Path, Path, Path]:
    """The study (simulated and cleaned), the tiny classifier and the cloned tiny policy under
    `out`, built unless already there."""
    from grail.clean.stage import clean
    from grail.tasks.slate.simulate import simulate
    from grail.train.config import parse_train_args
    from grail.train.stage import run as train
    from grail.train.tiny import build_tiny_model

    data = out / "clean"
    if not (data / "_COMPLETE.json").is_file():
        simulate(out / "raw", participants=participants)
        clean(out / "raw", data)
    policy, classifier = out / "tiny-model", out / "tiny-discriminator"
    if not (policy / "config.json").is_file():
        build_tiny_model(policy, data=str(data), format_warmup=150)
    if not (classifier / "config.json").is_file():
        build_tiny_model(classifier, tokenizer=str(policy), task="classifier")
    cloned = out / "cloned"
    if not (cloned / "summary.json").is_file():
        argv = ["--config", str(ROOT / "recipes/tiny/config_bc.yaml"), "--dataset", str(data)]
        argv += ["--model_name_or_path", str(policy), "--output_dir", str(cloned)]
        argv += ["--issues", issue]
        train(*parse_train_args(argv))
    return data, classifier, cloned


def scored_rows(data: Path, issue: str, split: str, limit: int | None, prompt: dict):
    """The split's rows of `issue` (first `limit`), each with its example (displayed order)
    and the study's true choice probabilities."""
    from grail.tasks.slate.benchmark.systems import load_truth, truth_choices
    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import PromptOptions, to_example

    rows = [r for r in read_dataset(data, split=split).to_pylist() if r["issue"] == issue]
    rows = rows[:limit] if limit else rows
    fields = PromptOptions.__dataclass_fields__
    options = PromptOptions(**{k: v for k, v in prompt.items() if k in fields})
    truth = truth_choices(rows, load_truth(data, None))
    if truth is None:
        raise SystemExit(f"{data}: no truth_steps.csv with choice probabilities (grail simulate)")
    return rows, [to_example(r, options) for r in rows], truth


def policy_q(cloned: Path, examples: list[dict], replies: list[str] | None = None):
    """The cloned model's choice distribution q per example after each reply's thought (its
    text up to and with ``<answer>``; by default an empty thought): the log_score reward's own
    reading (grail.tasks.slate.rewards), the thought opened by the chat template where it
    opens one (a thinking recipe's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.tasks.slate.rewards import ANSWER_TAG, LogScoreReward

    reward = LogScoreReward()
    reward.bind(AutoModelForCausalLM.from_pretrained(cloned), AutoTokenizer.from_pretrained(cloned))
    chats = [reward.chat(e["prompt"]) for e in examples]
    if replies is None:
        replies = [
            "</think>" if chat.rstrip().endswith("<think>") else "<think></think>" for chat in chats
        ]
    thoughts = [reply.partition(ANSWER_TAG)[0] + ANSWER_TAG for reply in replies]
    return reward.distributions(chats, thoughts, [e["n_options"] for e in examples])


def sample(q: list[float], rng: random.Random) -> int:
    """An option (1-based) drawn from q."""
    return rng.choices(range(1, len(q) + 1), weights=q)[0]


def expected_log_loss(p: list[float], q: list[float]) -> float:
    return -sum(pa * math.log(max(qa, 1e-12)) for pa, qa in zip(p, q, strict=True) if pa)


def reweighted(q: list[float], logits: list[float]) -> list[float]:
    """q * exp(logit), renormalised: where GAIL's reward could move the policy at most."""
    top = max(logits)
    weights = [qa * math.exp(la - top) for qa, la in zip(q, logits, strict=True)]
    return [w / sum(weights) for w in weights]


def balanced_accuracy(scores: list[float], labels: list[float], cut: float) -> float:
    real = [s > cut for s, y in zip(scores, labels, strict=True) if y == 1.0]
    fake = [s <= cut for s, y in zip(scores, labels, strict=True) if y == 0.0]
    return (sum(real) / len(real) + sum(fake) / len(fake)) / 2


def pairs_for(examples, qs, rng) -> tuple[list, list]:
    """Per example: the person's choice (real, 1) and one option drawn from q (policy, 0)."""
    drawn = [sample(q, rng) for q in qs]
    real = [(e, e["gold_index"], 1.0) for e in examples]
    fake = [(e, a, 0.0) for e, a in zip(examples, drawn, strict=True)]
    return real, fake


def text_discriminator(make, minibatch: int, updates: int, seed: int):
    """A grail discriminator, fresh (`make()`), trained `updates` balanced minibatches of
    `minibatch` on pairs' texts (GRAIL's reading: the chosen option, the viewer, then the
    whole slate); returns a fitter of pairs to their scorer (their logits)."""
    import torch

    from grail.tasks.slate.discriminator import choice_text
    from grail.train.gail import ReplayBuffer

    def fit(pairs):
        torch.manual_seed(seed)
        disc = make()
        buffer = ReplayBuffer(len(pairs), seed=seed)
        buffer.extend((choice_text(e["prompt"], a), y) for e, a, y in pairs)
        for _ in range(updates):
            batch = buffer.sample(minibatch)
            disc.update([t for t, _ in batch], [y for _, y in batch])
        return lambda scored: disc.logits([choice_text(e["prompt"], a) for e, a, _ in scored])

    return fit


def tiny_discriminator(classifier: Path, updates: int, seed: int):
    """grail's Discriminator (``gail_discriminator: classifier``: the tiny classifier), lr
    1e-3, minibatches of 32."""
    from grail.train.gail import Discriminator

    def make():
        return Discriminator(str(classifier), device="cpu", lr=1e-3, max_length=512)

    return text_discriminator(make, 32, updates, seed)


def feature_discriminator(updates: int, seed: int):
    """grail's FeatureDiscriminator (``gail_discriminator: features``) with the tiny GRAIL
    recipe's settings: lr 0.01, weight decay 1.0, minibatches of 64."""
    from grail.tasks.slate.discriminator import crossed_features
    from grail.train.gail import FeatureDiscriminator

    return text_discriminator(
        lambda: FeatureDiscriminator(crossed_features, lr=0.01, weight_decay=1.0),
        64,
        updates,
        seed,
    )


def logistic_discriminator(rows_by_id):
    """A logistic regression on the ranker's features of (row, option), people's choices
    against the cloned model's draws; returns a fitter like :func:`tiny_discriminator`'s."""
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.linear_model import LogisticRegression

    from grail.tasks.slate.baselines import option_features

    hasher = FeatureHasher(n_features=2**18, input_type="dict")

    def features(pairs):
        return hasher.transform(option_features(rows_by_id[id(e)], a - 1) for e, a, _ in pairs)

    def fit(pairs):
        model = LogisticRegression(C=0.5, max_iter=2000, solver="liblinear")
        model.fit(features(pairs), [y for _, _, y in pairs])
        return lambda scored: model.decision_function(features(scored)).tolist()

    return fit


def temperature(logits: list[float], labels: list[float]) -> float:
    """The scale t of the logits that maximises the likelihood of the labels (a grid): a
    discriminator's logit is log D / (1 - D), the density ratio GAIL moves the policy by, only
    once it is calibrated; an over-confident one's ratio overshoots.

    >>> temperature([2.0, -2.0, 2.0, -2.0], [1.0, 0.0, 0.0, 1.0])
    0.0
    """

    def loss(t):
        return sum(
            math.log1p(math.exp(-t * z)) if y == 1.0 else math.log1p(math.exp(t * z))
            for z, y in zip(logits, labels, strict=True)
        )

    return min((k / 20 for k in range(0, 41)), key=loss)


def judged(fit, real, fake, held_pairs, examples):
    """A discriminator fitted on three quarters of the train rows' pairs, its logits'
    temperature on the last quarter; its held-out balanced accuracy (validation pairs) and
    each example's calibrated logit for every option."""
    cut = len(real) * 3 // 4
    score = fit(real[:cut] + fake[:cut])
    calibration = real[cut:] + fake[cut:]
    t = temperature(score(calibration), [y for _, _, y in calibration])
    accuracy = balanced_accuracy(score(held_pairs), [y for _, _, y in held_pairs], 0.0)
    every = [(e, a, 0.0) for e in examples for a in range(1, e["n_options"] + 1)]
    flat = iter(score(every))
    return accuracy, t, [[t * next(flat) for _ in range(e["n_options"])] for e in examples]


def paired(values: list[float], against: list[float], people: list[str]) -> str:
    from grail.core.bootstrap import paired_difference

    d = paired_difference(values, against, people)
    return f"{d['difference']:+.4f} [{d['ci'][0]:+.4f}, {d['ci'][1]:+.4f}]"


def thought_spread(cloned: Path, examples, truth, k: int, temperature: float, tokens: int):
    """K sampled completions per row from the cloned model; the log score of q after each
    thought: rows whose K scores are equal, mean within-row std, best-of-K expected log-loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.tasks.slate.rewards import ANSWER_TAG
    from grail.train.rl_signal import SPREAD_FLOOR, thoughts
    from grail.train.sampling import sample_replies

    tokenizer = AutoTokenizer.from_pretrained(cloned)
    model = AutoModelForCausalLM.from_pretrained(cloned)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    prompts = [e["prompt"] for e in examples for _ in range(k)]
    replies = sample_replies(model, tokenizer, prompts, tokens, temperature, 16)
    qs = policy_q(cloned, [e for e in examples for _ in range(k)], replies)
    scores, best, flat, spreads = [], [], 0, []
    for e, p in zip(examples, truth, strict=True):
        own = qs[flat : flat + k]
        flat += k
        # the reward's: a reply without <answer> gets the floor, whatever q after it
        answered = [ANSWER_TAG in r for r in replies[flat - k : flat]]
        row_scores = [
            math.log(max(q[e["gold_index"] - 1], 1e-3)) if ok else math.log(1e-3)
            for q, ok in zip(own, answered, strict=True)
        ]
        spreads.append(statistics.pstdev(row_scores))
        # the oracle keeps the best reply that answers (any, where none does)
        kept = [q for q, ok in zip(own, answered, strict=True) if ok] or own
        best.append(min(expected_log_loss(p, q) for q in kept))
        scores.append(statistics.mean(expected_log_loss(p, q) for q in own))
    flat_rows = sum(s <= SPREAD_FLOOR for s in spreads) / len(spreads)
    return {
        "flat_rows": flat_rows,
        "within_std": statistics.mean(spreads),
        "non_empty_thoughts": thoughts(replies)[0] / len(replies),
        "answered": sum(ANSWER_TAG in r for r in replies) / len(replies),
        "mean": scores,
        "best": best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="rl_headroom_outputs")
    parser.add_argument("--issue", default="gun_control")
    parser.add_argument("--participants", type=int, default=1500)
    parser.add_argument("--clean", help="a cleaned synthetic study (default: built under --out)")
    parser.add_argument("--cloned", help="a cloned model folder (default: the tiny, cloned)")
    parser.add_argument("--discriminator", help="the tiny classifier (default: built)")
    parser.add_argument(
        "--train-rows",
        type=int,
        default=2000,
        help="train rows the discriminators learn from (one real, one policy pair each)",
    )
    parser.add_argument("--rows", type=int, default=600, help="validation rows scored")
    parser.add_argument("--updates", type=int, default=800, help="tiny discriminator updates")
    parser.add_argument("--k", type=int, default=8, help="sampled thoughts per row for (b)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.clean and args.cloned and args.discriminator:
        data, classifier, cloned = Path(args.clean), Path(args.discriminator), Path(args.cloned)
    else:
        data, classifier, cloned = prepared(out, args.issue, args.participants)
    model = cloned / "sft" if (cloned / "sft" / "config.json").is_file() else cloned
    prompt = json.loads((cloned / "prompt.json").read_text())
    rng = random.Random(args.seed)
    train_rows, train_examples, _ = scored_rows(data, args.issue, "train", None, prompt)
    picked = rng.sample(range(len(train_rows)), min(args.train_rows, len(train_rows)))
    train_rows = [train_rows[k] for k in picked]
    train_examples = [train_examples[k] for k in picked]
    rows, examples, truth = scored_rows(data, args.issue, "validation", args.rows, prompt)
    people = [r["participant_id"] for r in rows]
    by_id = {id(e): r for e, r in zip(train_examples + examples, train_rows + rows, strict=True)}

    train_q = policy_q(model, train_examples)
    q = policy_q(model, examples)
    real, fake = pairs_for(train_examples, train_q, rng)
    held_real, held_fake = pairs_for(examples, q, rng)
    cloned_loss = [expected_log_loss(p, qq) for p, qq in zip(truth, q, strict=True)]
    ceiling = statistics.mean(expected_log_loss(p, p) for p in truth)
    table = [
        "| discriminator | held-out balanced accuracy | temperature | expected log-loss | "
        "minus cloned's [95% CI] |",
        "|---|---:|---:|---:|---:|",
        f"| (the cloned model) | | | {statistics.mean(cloned_loss):.4f} | |",
    ]
    for name, fit in (
        (f"tiny sequence classifier (GRAIL's, {args.updates} updates)",
         tiny_discriminator(classifier, args.updates, args.seed)),
        ("GRAIL's features discriminator (200 updates of 64)",
         feature_discriminator(200, args.seed)),
        ("logistic on the ranker's features", logistic_discriminator(by_id)),
    ):  # fmt: skip
        accuracy, t, logits = judged(fit, real, fake, held_real + held_fake, examples)
        moved = [
            expected_log_loss(p, reweighted(qq, lg))
            for p, qq, lg in zip(truth, q, logits, strict=True)
        ]
        table.append(
            f"| {name} | {accuracy:.3f} | {t:.2f} | {statistics.mean(moved):.4f} | "
            f"{paired(moved, cloned_loss, people)} |"
        )
    table.append(f"| (the study's choice model: the ceiling) | | | {ceiling:.4f} | |")
    print(f"## (a) The GAIL bound: {len(rows)} validation rows of {args.issue}, "
          f"{len(train_rows)} train rows\n")  # fmt: skip
    print("\n".join(table))

    spread = thought_spread(
        model, examples, truth, args.k, prompt.get("temperature", 1.0),
        prompt.get("max_new_tokens", 12),
    )  # fmt: skip
    print(f"\n## (b) The log-score bound: {args.k} sampled completions per row\n")
    print(
        "| rows with equal scores | mean within-row std | non-empty thoughts | answered | "
        "expected log-loss, a thought drawn | best of K | best of K minus cloned's [95% CI] |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {spread['flat_rows']:.3f} | {spread['within_std']:.4f} | "
          f"{spread['non_empty_thoughts']:.3f} | {spread['answered']:.3f} | "
          f"{statistics.mean(spread['mean']):.4f} | "
          f"{statistics.mean(spread['best']):.4f} | "
          f"{paired(spread['best'], cloned_loss, people)} |")  # fmt: skip
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
