"""Benchmark metrics: accuracy with Wilson intervals, parse rate, win rates, opinion metrics, and
the probabilistic scores of a simulator.

All functions are pure: they take per-row predictions (1-based option numbers, None when the
answer could not be parsed) and labels, and return plain dictionaries.

A simulator predicts, per row, a probability distribution over the slate's options (a list of
floats in displayed order, one per option, summing to 1). It is scored by log-loss, Brier score,
calibration error and how far its mass per display position is from the people's choices
(`simulator_scores`). A participant contributes several correlated rows, so every interval is a
participant (cluster) bootstrap (:mod:`grail.core.bootstrap`): participants are resampled,
never single rows; the shares of positions and the binned calibration gap are `SumStatistic`s,
which it resamples in one matrix product.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from grail.core.bootstrap import (
    SumStatistic,
    mean_statistic,
    participant_bootstrap,
)

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


LOG_FLOOR = 1e-6  # the smallest probability log-loss charges for (a miss costs at most ~13.8)
MAX_POSITIONS = 8  # the longest slate
# simulator_scores' metrics
SIMULATOR_METRICS = ("log_loss", "calibrated_log_loss", "brier", "ece", "position_tv")


def _padded(distributions: Sequence[Sequence[float]], width: int | None = None) -> tuple:
    """Rows as a zero-padded (rows, width) matrix and the mask of the real options."""
    lengths = [len(row) for row in distributions]
    if any(length == 0 for length in lengths):
        raise ValueError(f"row {lengths.index(0)} has an empty distribution")
    width = max(lengths, default=0) if width is None else width
    if any(length > width for length in lengths):
        raise ValueError(f"a row has {max(lengths)} options, more than the {width} positions")
    matrix = np.zeros((len(lengths), width))
    mask = np.arange(width) < np.array(lengths, dtype=int).reshape(-1, 1)
    for i, row in enumerate(distributions):
        matrix[i, : len(row)] = row
    return matrix, mask


def _gold_array(golds: Sequence[int], lengths: np.ndarray) -> np.ndarray:
    """The 1-based chosen options as an integer array, each checked against its row's length."""
    if len(golds) != len(lengths):
        raise ValueError(f"{len(golds)} golds for {len(lengths)} distributions")
    gold = np.asarray(golds, dtype=int).reshape(-1)
    bad = np.flatnonzero((gold < 1) | (gold > lengths))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"row {i}: gold {gold[i]} is not an option 1..{lengths[i]}")
    return gold


def _one_hot(gold: np.ndarray, width: int) -> np.ndarray:
    onehot = np.zeros((len(gold), width))
    onehot[np.arange(len(gold)), gold - 1] = 1.0
    return onehot


def _binned_gap(sums: np.ndarray, bins: int) -> np.ndarray:
    """ECE from summed columns (per bin: predictions, outcomes; then the number of pairs), one
    value per row of `sums`; 0 where there are no pairs."""
    # sum_b (n_b / N) * |mean p_b - mean y_b| = sum_b |sum p_b - sum y_b| / N
    gaps = np.abs(sums[:, :bins] - sums[:, bins : 2 * bins]).sum(axis=1)
    total = sums[:, -1]
    return np.divide(gaps, total, out=np.zeros(len(sums)), where=total > 0)


def _ece_statistic(
    matrix: np.ndarray, mask: np.ndarray, gold: np.ndarray, bins: int
) -> SumStatistic:
    """ECE of (row, option) pairs as a `SumStatistic`: each row's sums of its predictions `p`
    and outcomes `y` (0/1) in each equal-width bin, and its number of pairs."""
    n = len(matrix)
    pair_row = np.nonzero(mask)[0]
    p, y = matrix[mask], _one_hot(gold, matrix.shape[1])[mask]
    cell = pair_row * bins + np.minimum((p * bins).astype(int), bins - 1)
    per_row = np.column_stack(
        [
            np.bincount(cell, weights=p, minlength=n * bins).reshape(n, bins),
            np.bincount(cell, weights=y, minlength=n * bins).reshape(n, bins),
            np.bincount(pair_row, minlength=n),
        ]
    )
    return SumStatistic(per_row, lambda sums: _binned_gap(sums, bins))


def row_log_loss(distribution: Sequence[float], gold: int, floor: float = LOG_FLOOR) -> float:
    """-log of the probability given to the chosen option (1-based `gold`), floored at `floor`.

    >>> round(row_log_loss([0.25, 0.25, 0.25, 0.25], 2), 4)
    1.3863
    >>> round(row_log_loss([1.0, 0.0], 2), 4)
    13.8155
    """
    if not 1 <= gold <= len(distribution):
        raise ValueError(f"gold {gold} is not an option 1..{len(distribution)}")
    return -math.log(max(distribution[gold - 1], floor))


def row_brier(distribution: Sequence[float], gold: int) -> float:
    """Multi-class Brier score: sum over options of (p_k - [k == gold])^2, from 0 to 2.

    >>> row_brier([0.25, 0.25, 0.25, 0.25], 1)
    0.75
    >>> row_brier([0.0, 1.0], 1)
    2.0
    """
    if not 1 <= gold <= len(distribution):
        raise ValueError(f"gold {gold} is not an option 1..{len(distribution)}")
    return sum((p - (k == gold)) ** 2 for k, p in enumerate(distribution, start=1))


def expected_log_loss(distribution: Sequence[float]) -> float:
    """Log-loss expected when the choice is drawn from `distribution` itself: its entropy.

    The ceiling of a synthetic study whose true choice probabilities are known (0 log 0 = 0).

    >>> round(expected_log_loss([0.25, 0.25, 0.25, 0.25]), 4)
    1.3863
    >>> expected_log_loss([1.0, 0.0])
    0.0
    """
    p = np.asarray(distribution, dtype=float)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum()) + 0.0  # + 0.0 turns -0.0 into 0.0


def cross_entropy(
    truth: Sequence[float], distribution: Sequence[float], floor: float = LOG_FLOOR
) -> float:
    """Log-loss of `distribution` expected when the choice is drawn from `truth` (the known
    choice model of a synthetic study): -sum truth_k log p_k, each p floored at `floor`. The
    same quantity as the mean :func:`row_log_loss` over many people, without the noise of
    which option one person happened to click; minus ``expected_log_loss(truth)`` it is the
    KL divergence from the truth.

    >>> round(cross_entropy([0.5, 0.5], [0.5, 0.5]), 4), round(cross_entropy([1, 0], [0.5, 0.5]), 4)
    (0.6931, 0.6931)
    """
    if len(truth) != len(distribution):
        raise ValueError(f"{len(truth)} true probabilities for {len(distribution)} options")
    return float(
        -sum(t * math.log(max(p, floor)) for t, p in zip(truth, distribution, strict=True) if t)
    )


def expected_brier(distribution: Sequence[float]) -> float:
    """Brier score expected when the choice is drawn from `distribution` itself: 1 - sum p^2.

    >>> expected_brier([0.25, 0.25, 0.25, 0.25])
    0.75
    >>> expected_brier([1.0, 0.0])
    0.0
    """
    p = np.asarray(distribution, dtype=float)
    return float(1.0 - (p * p).sum())


def calibration_error(
    distributions: Sequence[Sequence[float]], golds: Sequence[int], bins: int = 10
) -> float:
    """Expected calibration error over every (row, option) pair.

    Each option of each row is one prediction: its probability p, and the outcome y = 1 when it
    was the chosen option, else 0. The pairs fall in `bins` equal-width bins on [0, 1] (p = 1 in
    the last); ECE = sum over bins of (n_b / N) * |mean p in b - mean y in b|, N all pairs.
    0 is perfectly calibrated; padding beyond a row's options is not a pair.

    >>> calibration_error([[0.5, 0.5], [0.5, 0.5]], [1, 2])
    0.0
    >>> calibration_error([[0.9, 0.1], [0.9, 0.1]], [2, 2])
    0.9
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    matrix, mask = _padded(distributions)
    gold = _gold_array(golds, mask.sum(axis=1))
    return _ece_statistic(matrix, mask, gold, bins)(np.arange(len(gold)))


def position_shares(
    distributions: Sequence[Sequence[float]], max_positions: int = MAX_POSITIONS
) -> list[float]:
    """Mean over rows of the probability at each display position (shorter rows add 0 there).

    >>> position_shares([[0.5, 0.5], [0.2, 0.3, 0.5]], max_positions=4)
    [0.35, 0.4, 0.25, 0.0]
    """
    matrix, _ = _padded(distributions, max_positions)
    if not len(matrix):
        return [0.0] * max_positions
    return [float(x) for x in matrix.mean(axis=0)]


def gold_shares(golds: Sequence[int], max_positions: int = MAX_POSITIONS) -> list[float]:
    """The share of rows whose chosen option sat at each display position (1-based golds).

    >>> gold_shares([1, 1, 2, 4], max_positions=4)
    [0.5, 0.25, 0.0, 0.25]
    """
    gold = np.asarray(golds, dtype=int).reshape(-1)
    if gold.size and (gold.min() < 1 or gold.max() > max_positions):
        raise ValueError(f"golds must lie in 1..{max_positions}")
    if not gold.size:
        return [0.0] * max_positions
    counts = np.bincount(gold - 1, minlength=max_positions)
    return [float(x) for x in counts / gold.size]


def total_variation(
    p: Sequence[float] | Mapping[Hashable, float], q: Sequence[float] | Mapping[Hashable, float]
) -> float:
    """Total variation distance 0.5 * sum |p_i - q_i|, from 0 (same) to 1 (disjoint).

    Lists must have equal length; dicts are keyed by category (a missing key counts as 0).

    >>> total_variation([0.5, 0.5], [1.0, 0.0])
    0.5
    >>> total_variation({"a": 1.0}, {"b": 1.0})
    1.0
    """
    if isinstance(p, Mapping) != isinstance(q, Mapping):
        raise ValueError("total_variation needs two lists or two dicts, not one of each")
    if isinstance(p, Mapping):
        keys = list(set(p) | set(q))
        p, q = [p.get(k, 0.0) for k in keys], [q.get(k, 0.0) for k in keys]
    a, b = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"distributions of lengths {len(a)} and {len(b)}")
    return float(0.5 * np.abs(a - b).sum())


def mean_distance(first: np.ndarray, second: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Total variation between the mean rows ``first / count`` and ``second / count``, one per
    row of sums: :func:`total_variation` of two mean distributions, vectorised.

    >>> mean_distance(np.array([[1.0, 1.0]]), np.array([[2.0, 0.0]]), np.array([2.0]))
    array([0.5])
    """
    return 0.5 * np.abs(first / count[:, None] - second / count[:, None]).sum(axis=1)


def share_distance(first: np.ndarray, second: np.ndarray) -> SumStatistic:
    """Total variation between the mean rows of two (rows x categories) matrices (simulated and
    chosen shares of display positions or slants) as a `SumStatistic`.

    >>> share_distance(np.array([[0.5, 0.5], [0.5, 0.5]]), np.eye(2))(np.array([0, 0]))
    0.5
    """
    width = first.shape[1]
    return SumStatistic(
        np.column_stack([first, second, np.ones(len(first))]),
        lambda s: mean_distance(s[:, :width], s[:, width : 2 * width], s[:, -1]),
    )


def _simulator_statistics(
    matrix: np.ndarray,
    mask: np.ndarray,
    gold: np.ndarray,
    bins: int = 10,
    truths: np.ndarray | None = None,
) -> dict[str, SumStatistic]:
    """Each simulator metric as a `SumStatistic` (a function of a row-index array, rows may
    repeat); with the true choice probabilities (`truths`, padded like `matrix`) also the
    expected log-loss."""
    n, width = matrix.shape
    onehot = _one_hot(gold, width)
    log_losses = -np.log(np.maximum(matrix[np.arange(n), gold - 1], LOG_FLOOR))
    statistics = {
        "log_loss": mean_statistic(log_losses),
        "brier": mean_statistic(((matrix - onehot) ** 2).sum(axis=1)),
        "ece": _ece_statistic(matrix, mask, gold, bins),
        "position_tv": share_distance(matrix, onehot),
    }
    if truths is not None:
        expected = -(truths * np.log(np.maximum(matrix, LOG_FLOOR))).sum(axis=1)
        statistics["expected_log_loss"] = mean_statistic(expected)
    return statistics


TEMPERATURES = np.exp(np.linspace(-2.0, 2.0, 81))  # the grid one temperature is fitted on


def calibrated_log_losses(
    matrix: np.ndarray, mask: np.ndarray, gold: np.ndarray, participants: Sequence[Hashable]
) -> np.ndarray:
    """Each row's log-loss after one temperature T (q proportional to q^(1/T)), cross-fitted:
    the participants split in two halves, each half's T the one that minimises the other
    half's log-loss. What remains is the ranking's cost; the raw log-loss minus it, the
    calibration's. A distribution that is right but too sharp gets T > 1 and a lower loss.

    >>> sharp = np.array([[0.98, 0.02]] * 8)  # right 3 times in 4, and far too sure
    >>> gold = np.array([1, 2, 1, 2, 1, 1, 1, 1])
    >>> raw = -np.log(sharp[np.arange(8), gold - 1]).mean()
    >>> calibrated = calibrated_log_losses(sharp, sharp > 0, gold, list("aabbccdd")).mean()
    >>> round(float(raw), 3), round(float(calibrated), 3)
    (0.993, 0.562)
    """
    log_q = np.log(np.maximum(matrix, LOG_FLOOR))
    order = {person: k for k, person in enumerate(dict.fromkeys(participants))}
    fold = np.array([order[person] % 2 for person in participants])
    rows = np.arange(len(gold))

    def losses(temperature: float, chosen: np.ndarray) -> np.ndarray:
        logits = np.where(mask[chosen], log_q[chosen] / temperature, -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(logits).sum(axis=1))
        return log_norm - logits[np.arange(len(chosen)), gold[chosen] - 1]

    out = np.empty(len(gold))
    for half in (0, 1):
        fit, apply = rows[fold != half], rows[fold == half]
        if not len(apply):
            continue
        fit = fit if len(fit) else apply  # one participant: fitted on itself
        best = min(TEMPERATURES, key=lambda t: losses(t, fit).mean())
        out[apply] = losses(best, apply)
    return np.minimum(out, -math.log(LOG_FLOOR))  # floored as the raw log-loss is


def simulator_scores(
    distributions: Sequence[Sequence[float]],
    golds: Sequence[int],
    participants: Sequence[Hashable],
    replicates: int = 1000,
    seed: int = 0,
    truths: Sequence[Sequence[float]] | None = None,
) -> dict:
    """Log-loss, Brier, ECE and position TV of one simulator, each with a participant-bootstrap
    interval (`METRIC_ci`), plus the top display position's share for a collapse check. With
    the study's true choice probabilities per row (`truths`), also ``expected_log_loss``
    (:func:`cross_entropy` per row).

    `position_tv` is the total variation between `position_shares` and `gold_shares`;
    `top_share`/`top_position` the simulator's largest position share and its 1-based position,
    `human_top_share` the people's largest.

    >>> s = simulator_scores([[0.5, 0.5], [0.5, 0.5]], [1, 2], ["a", "b"], replicates=50)
    >>> s["log_loss"], s["brier"], s["ece"], s["position_tv"], s["top_position"], s["n"]
    (0.6931, 0.5, 0.0, 0.0, 1, 2)
    """
    if len(participants) != len(distributions):
        raise ValueError(f"{len(participants)} participants for {len(distributions)} rows")
    matrix, mask = _padded(distributions, max(MAX_POSITIONS, *map(len, distributions), 0))
    gold = _gold_array(golds, mask.sum(axis=1))
    if not gold.size:
        empty = {f"{name}{tail}": None for name in SIMULATOR_METRICS for tail in ("", "_ci")}
        return {"n": 0, **empty, "top_share": None, "top_position": None, "human_top_share": None}
    scores: dict = {"n": int(gold.size)}
    known = None if truths is None else _padded(truths, matrix.shape[1])[0]
    statistics = _simulator_statistics(matrix, mask, gold, truths=known)
    calibrated = calibrated_log_losses(matrix, mask, gold, participants)
    statistics["calibrated_log_loss"] = mean_statistic(calibrated)
    for name, statistic in statistics.items():
        low, high = participant_bootstrap(statistic, participants, replicates, seed)
        scores[name] = round(statistic(np.arange(gold.size)), 4)
        scores[f"{name}_ci"] = [round(low, 4), round(high, 4)]
    shares = matrix.mean(axis=0)
    top = int(np.argmax(shares))
    scores["top_share"] = round(float(shares[top]), 4)
    scores["top_position"] = top + 1
    scores["human_top_share"] = round(float(_one_hot(gold, matrix.shape[1]).mean(axis=0).max()), 4)
    return scores
