"""Next-click baselines: position rules, popularity, kNN over TF-IDF, and a learned ranker.

Each baseline takes the training rows (possibly none) and the rows to predict (dicts in the dataset
contract) and returns :class:`Guesses`: one 1-based option number per row and a choice
distribution per row (scored as a simulator: log-loss, Brier, calibration), or raises
:class:`Skipped` with the reason when it cannot run (e.g. it needs a train split that is not
there). The distributions: the position rules share the train split's frequency of each chosen
position per slate size (add-one smoothed; uniform without a train split); ``most_viewed`` gives
its pick its train hit rate and the other options the rest equally; ``knn_tfidf`` its vote
shares mixed 9:1 with uniform; ``ranker`` its logit scores softmaxed within the slate.

- ``always_first`` / ``always_last``: option 1 / option n.
- ``most_frequent_position``: the commonest gold position in train, clipped to the slate size.
- ``most_viewed``: the option with the most views (unknown views rank last; ties go to the first).
- ``knn_tfidf``: TF-IDF over the prompt without its OPTIONS block (viewer, current video,
  history), fit on train; the 50 most similar train rows vote for their clicked video with their
  cosine similarity; the slate option with the most votes wins (option 1 when no neighbour's click
  is on the slate).
- ``ranker``: logistic regression over (row, option) pairs, fit on train: position, popularity,
  duration, missing-field flags, and hashed crosses of the viewer's party, ideology and issue
  items with the option's channel and title words (and of the current video's channel with the
  option's channel); the most probable option wins.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from grail.inference.answers import renormalised
from grail.tasks.slate.prompts import build_user_prompt

# The benchmark's reference systems computed from the study's truth (grail simulate), not fitted.
EXPECTED_CEILING = "bayes_optimal (expected)"
BLIND_CEILING = "position_blind (expected)"
ORACLE = "oracle (choice model's best pick)"


class Skipped(Exception):
    """A baseline that cannot run on this data; the message says why."""


@dataclass
class Guesses:
    """A baseline's pick (1-based) and choice distribution (displayed order) per row."""

    predictions: list[int]
    distributions: list[list[float]]


def position_frequencies(train: list[dict], rows: list[dict]) -> list[list[float]]:
    """The train split's share of each chosen position for each row's slate size, add-one
    smoothed (uniform without a train split).

    >>> position_frequencies([{"n_options": 2, "gold_index": 1}] * 2, [{"n_options": 2}])
    [[0.75, 0.25]]
    """
    counts = Counter((r["n_options"], r["gold_index"]) for r in train)
    return [
        renormalised([counts[(r["n_options"], k)] + 1.0 for k in range(1, r["n_options"] + 1)])
        for r in rows
    ]


def always_first(train: list[dict], rows: list[dict]) -> Guesses:
    return Guesses([1 for _ in rows], position_frequencies(train, rows))


def always_last(train: list[dict], rows: list[dict]) -> Guesses:
    return Guesses([r["n_options"] for r in rows], position_frequencies(train, rows))


def most_frequent_position(train: list[dict], rows: list[dict]) -> Guesses:
    """The commonest gold position in train, clipped to each slate's size.

    >>> most_frequent_position([{"gold_index": 3, "n_options": 4}] * 2,
    ...     [{"n_options": 4}, {"n_options": 2}]).predictions
    [3, 2]
    """
    if not train:
        raise Skipped("needs a train split to find the commonest gold position")
    position = Counter(r["gold_index"] for r in train).most_common(1)[0][0]
    return Guesses([min(position, r["n_options"]) for r in rows], position_frequencies(train, rows))


def pick_with_hit_rate(picks: list[int], rows: list[dict], hit_rate: float) -> list[list[float]]:
    """A rule's pick with probability `hit_rate`, the other options sharing the rest.

    >>> pick_with_hit_rate([2], [{"n_options": 3}], 0.5)
    [[0.25, 0.5, 0.25]]
    """
    out = []
    for pick, row in zip(picks, rows, strict=True):
        n = row["n_options"]
        rest = (1 - hit_rate) / (n - 1) if n > 1 else 0.0
        out.append([hit_rate if k == pick else rest for k in range(1, n + 1)] if n > 1 else [1.0])
    return out


def most_viewed_picks(rows: list[dict]) -> list[int]:
    """The option with the most views (unknown views rank last; ties go to the first).

    >>> most_viewed_picks([{"slate": [{"views": 5}, {"views": None}, {"views": 9}]}])
    [3]
    """

    def views(item: dict) -> int:
        return -1 if item.get("views") is None else item["views"]

    return [max(range(len(r["slate"])), key=lambda j: (views(r["slate"][j]), -j)) + 1 for r in rows]


def most_viewed(train: list[dict], rows: list[dict]) -> Guesses:
    """The most viewed option, given its train hit rate (add-one smoothed; 1/2 without train)."""
    hits = sum(p == r["gold_index"] for p, r in zip(most_viewed_picks(train), train, strict=True))
    picks = most_viewed_picks(rows)
    return Guesses(picks, pick_with_hit_rate(picks, rows, (hits + 1) / (len(train) + 2)))


def state_text(row: dict) -> str:
    """The prompt without its OPTIONS block: who the viewer is and what they watch."""
    return build_user_prompt(row).partition("\n\nOPTIONS\n")[0]


def knn_tfidf(train: list[dict], rows: list[dict], k: int = 50, chunk: int = 512) -> Guesses:
    """Similarity-weighted votes of the k nearest train rows (see module docstring)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    if not train:
        raise Skipped("needs a train split to find neighbours")
    vectorizer = TfidfVectorizer(sublinear_tf=True, min_df=2, dtype=np.float32)
    train_matrix = vectorizer.fit_transform([state_text(r) for r in train])
    row_matrix = vectorizer.transform([state_text(r) for r in rows])
    clicked = [r["gold_id"] for r in train]
    k = min(k, len(train))
    predictions, distributions = [], []
    for start in range(0, len(rows), chunk):
        similarity = (row_matrix[start : start + chunk] @ train_matrix.T).toarray()
        nearest = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
        for offset, neighbours in enumerate(nearest):
            row = rows[start + offset]
            votes = Counter()
            for j in neighbours:
                votes[clicked[j]] += float(similarity[offset, j])
            scores = [votes.get(item["id"], 0.0) for item in row["slate"]]
            predictions.append(int(np.argmax(scores)) + 1)
            shares = renormalised(scores)
            distributions.append([0.9 * p + 0.1 / len(scores) for p in shares])
    return Guesses(predictions, distributions)


VIEWER_CROSS_FIELDS = (
    "pid1",
    "ideo1",
    "gun_own",
    "stricter_laws",
    "assault_ban",
    "concealed_safe",
    "minwage15",
    "mw_support",
)
WORD = re.compile(r"[a-z0-9$]+")


def _log(value: int | None) -> float:
    return math.log1p(value) / 10 if value is not None else 0.0


def option_features(row: dict, j: int) -> dict[str, float]:
    """Features of option j of a row, for the ranker."""
    item, n = row["slate"][j], row["n_options"]
    features = {
        f"pos={j + 1}": 1.0,
        f"pos={j + 1}/n={n}": 1.0,
        "last": float(j + 1 == n),
        "views": _log(item.get("views")),
        "likes": _log(item.get("likes")),
        "comments": _log(item.get("comments")),
        "duration": (item.get("duration_seconds") or 0) / 600,
    }
    for name in ("channel", "duration_seconds", "views", "likes", "comments"):
        if item.get(name) is None:
            features[f"missing={name}"] = 1.0
    channel = item.get("channel") or "?"
    words = set(WORD.findall((item.get("title") or "").lower()))
    viewer = row.get("viewer") or {}
    for field in VIEWER_CROSS_FIELDS:
        if viewer.get(field):
            value = f"{field}={viewer[field]}"
            features[f"{value}|ch={channel}"] = 1.0
            for word in words:
                features[f"{value}|w={word}"] = 1.0
    current = (row.get("current_video") or {}).get("channel") or "?"
    features[f"cur={current}|ch={channel}"] = 1.0
    return features


def fit_ranker(train: list[dict]) -> Callable[[list[dict]], np.ndarray]:
    """Fit the ranker's logistic regression over (row, option) pairs (see module docstring);
    returns its scorer: rows -> one score per (row, option), rows in order."""
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.linear_model import LogisticRegression

    if not train:
        raise Skipped("needs a train split to fit on")
    hasher = FeatureHasher(n_features=2**18, input_type="dict")

    def pairs(data: list[dict]):
        return hasher.transform(option_features(r, j) for r in data for j in range(r["n_options"]))

    labels = [float(j + 1 == r["gold_index"]) for r in train for j in range(r["n_options"])]
    model = LogisticRegression(C=0.5, max_iter=2000, solver="liblinear")
    model.fit(pairs(train), labels)
    return lambda rows: model.decision_function(pairs(rows))


def ranker_distributions(scores: np.ndarray, rows: list[dict]) -> list[list[float]]:
    """Each row's option scores (consecutive in `scores`) as a softmax over its slate."""
    distributions, at = [], 0
    for r in rows:
        slate = scores[at : at + r["n_options"]]
        weights = np.exp(slate - slate.max())
        distributions.append((weights / weights.sum()).tolist())
        at += r["n_options"]
    return distributions


def ranker(train: list[dict], rows: list[dict]) -> Guesses:
    """Logistic regression over (row, option) pairs (see module docstring)."""
    distributions = ranker_distributions(fit_ranker(train)(rows), rows)
    return Guesses([int(np.argmax(d)) + 1 for d in distributions], distributions)


BASELINES: dict[str, Callable[[list[dict], list[dict]], Guesses]] = {
    "always_first": always_first,
    "always_last": always_last,
    "most_frequent_position": most_frequent_position,
    "most_viewed": most_viewed,
    "knn_tfidf": knn_tfidf,
    "ranker": ranker,
}
