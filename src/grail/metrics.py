"""Benchmark metrics: accuracy with Wilson intervals, parse rate, win rates, opinion metrics.

All functions are pure: they take per-row predictions (1-based option numbers, None when the
answer could not be parsed) and labels, and return plain dictionaries.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

Z95 = 1.959963984540054


def wilson_interval(correct: float, total: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for a proportion.

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    >>> wilson_interval(0, 0)
    (0.0, 1.0)
    """
    if total == 0:
        return 0.0, 1.0
    p = correct / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy(predictions: Sequence[int | None], gold: Sequence[int]) -> dict:
    """Accuracy, its Wilson interval, and the share of rows with a parsable prediction.

    >>> accuracy([1, 2, None, 3], [1, 3, 2, 3])
    {'n': 4, 'correct': 2, 'accuracy': 0.5, 'ci_low': 0.15, 'ci_high': 0.85, 'parse_rate': 0.75}
    """
    n = len(gold)
    correct = sum(p == g for p, g in zip(predictions, gold, strict=True))
    low, high = wilson_interval(correct, n)
    return {
        "n": n,
        "correct": correct,
        "accuracy": round(correct / n, 4) if n else 0.0,
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
        "parse_rate": round(sum(p is not None for p in predictions) / n, 4) if n else 0.0,
    }


def expected_accuracy(probabilities: Sequence[float]) -> dict:
    """For a predictor whose per-row hit probability is known (random pick, Bayes-optimal).

    >>> expected_accuracy([0.25, 0.5, 0.25, 1.0])["accuracy"]
    0.5
    """
    n = len(probabilities)
    expected = sum(probabilities)
    low, high = wilson_interval(expected, n)
    return {
        "n": n,
        "correct": round(expected, 2),
        "accuracy": round(expected / n, 4) if n else 0.0,
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
        "parse_rate": 1.0,
    }


def position_histogram(predictions: Sequence[int | None]) -> dict[str, int]:
    """How often each option number was predicted ("none" for unparsable).

    >>> position_histogram([1, 1, 3, None])
    {'1': 2, '3': 1, 'none': 1}
    """
    counts = Counter("none" if p is None else str(p) for p in predictions)
    return dict(sorted(counts.items(), key=lambda item: (item[0] == "none", item[0])))


def win_rate(
    ours: Sequence[int | None], theirs: Sequence[int | None], gold: Sequence[int]
) -> float:
    """Mean over rows of 1 (only ours right), 0.5 (both right or both wrong), 0 (only theirs).

    >>> win_rate([1, 2, 3, 4], [1, 1, 1, 4], [1, 2, 1, 3])
    0.5
    """
    scores = [0.5 + 0.5 * ((a == g) - (b == g)) for a, b, g in zip(ours, theirs, gold, strict=True)]
    return round(sum(scores) / len(scores), 4) if scores else 0.5


DIRECTION_SIGN = {"increase": 1, "decrease": -1, "no_change": 0}


def opinion_metrics(
    predicted: Sequence[str | None],
    labels: Sequence[str | None],
    before: Sequence[float | None],
    after: Sequence[float | None],
    shift: dict[str, float],
) -> dict:
    """Direction accuracy (rows with a label) and MAE of the implied opinion after the study.

    A predicted direction implies ``before + shift[direction]``, where `shift` is the mean change
    of that direction in the training split; an unparsable prediction implies no change.

    >>> m = opinion_metrics(["increase", None], ["increase", "decrease"], [0.5, 0.5], [0.6, 0.3],
    ...                     {"increase": 0.1, "decrease": -0.1, "no_change": 0.0})
    >>> m["direction_accuracy"], m["mae"], m["rmse"], m["n"]
    (0.5, 0.1, 0.1414, 2)
    """
    rows = [
        (p, lab, b, a)
        for p, lab, b, a in zip(predicted, labels, before, after, strict=True)
        if lab is not None
    ]
    if not rows:
        return {"n": 0, "direction_accuracy": None, "mae": None, "parse_rate": None}
    hits = sum(p == lab for p, lab, _, _ in rows)
    errors = [
        abs(b + shift.get(p or "no_change", 0.0) - a)
        for p, _, b, a in rows
        if a is not None and b is not None
    ]
    low, high = wilson_interval(hits, len(rows))
    return {
        "n": len(rows),
        "direction_accuracy": round(hits / len(rows), 4),
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
        "mae": round(sum(errors) / len(errors), 4) if errors else None,
        "rmse": round((sum(e * e for e in errors) / len(errors)) ** 0.5, 4) if errors else None,
        "parse_rate": round(sum(p is not None for p, *_ in rows) / len(rows), 4),
    }
