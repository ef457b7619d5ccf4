"""Next-click baselines: position rules, popularity, kNN over TF-IDF, and a learned ranker.

Each baseline takes the training rows (possibly none) and the rows to predict (dicts in the dataset
contract) and returns one 1-based option number per row, or raises :class:`Skipped` with the
reason when it cannot run (e.g. it needs a train split that is not there).

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

import numpy as np

from grail.prompts import build_user_prompt

# The benchmark's reference systems computed from the study's truth (grail simulate), not fitted.
EXPECTED_CEILING = "bayes_optimal (expected)"
BLIND_CEILING = "position_blind (expected)"
ORACLE = "oracle (choice model's best pick)"


class Skipped(Exception):
    """A baseline that cannot run on this data; the message says why."""


def always_first(train: list[dict], rows: list[dict]) -> list[int]:
    return [1 for _ in rows]


def always_last(train: list[dict], rows: list[dict]) -> list[int]:
    return [r["n_options"] for r in rows]


def most_frequent_position(train: list[dict], rows: list[dict]) -> list[int]:
    """The commonest gold position in train, clipped to each slate's size.

    >>> most_frequent_position([{"gold_index": 3}] * 2, [{"n_options": 4}, {"n_options": 2}])
    [3, 2]
    """
    if not train:
        raise Skipped("needs a train split to find the commonest gold position")
    position = Counter(r["gold_index"] for r in train).most_common(1)[0][0]
    return [min(position, r["n_options"]) for r in rows]


def most_viewed(train: list[dict], rows: list[dict]) -> list[int]:
    """The option with the most views.

    >>> most_viewed([], [{"slate": [{"views": 5}, {"views": None}, {"views": 9}]}])
    [3]
    """

    def views(item: dict) -> int:
        return -1 if item.get("views") is None else item["views"]

    return [max(range(len(r["slate"])), key=lambda j: (views(r["slate"][j]), -j)) + 1 for r in rows]


def state_text(row: dict) -> str:
    """The prompt without its OPTIONS block: who the viewer is and what they watch."""
    return build_user_prompt(row).partition("\n\nOPTIONS\n")[0]


def knn_tfidf(train: list[dict], rows: list[dict], k: int = 50, chunk: int = 512) -> list[int]:
    """Similarity-weighted votes of the k nearest train rows (see module docstring)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    if not train:
        raise Skipped("needs a train split to find neighbours")
    vectorizer = TfidfVectorizer(sublinear_tf=True, min_df=2, dtype=np.float32)
    train_matrix = vectorizer.fit_transform([state_text(r) for r in train])
    row_matrix = vectorizer.transform([state_text(r) for r in rows])
    clicked = [r["gold_id"] for r in train]
    k = min(k, len(train))
    predictions = []
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
    return predictions


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


def ranker(train: list[dict], rows: list[dict]) -> list[int]:
    """Logistic regression over (row, option) pairs (see module docstring)."""
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
    scores = model.decision_function(pairs(rows))
    predictions, at = [], 0
    for r in rows:
        predictions.append(int(np.argmax(scores[at : at + r["n_options"]])) + 1)
        at += r["n_options"]
    return predictions


BASELINES: dict[str, Callable[[list[dict], list[dict]], list[int]]] = {
    "always_first": always_first,
    "always_last": always_last,
    "most_frequent_position": most_frequent_position,
    "most_viewed": most_viewed,
    "knn_tfidf": knn_tfidf,
    "ranker": ranker,
}
