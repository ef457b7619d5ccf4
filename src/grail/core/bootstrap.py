"""Intervals for clustered rows: a percentile bootstrap that resamples clusters (participants in
the slate task, documents in the summarize task), never single rows, and paired differences.

Rows of one cluster are correlated (a participant's choices, a document's questions), so every
interval here resamples whole clusters. The bootstrap is seeded, hence deterministic. A statistic
that depends on the rows only through sums of per-row columns (a mean, shares, binned gaps) is a
`SumStatistic`, which the bootstrap resamples in one matrix product.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np


def _participant_codes(participants: Sequence[Hashable]) -> np.ndarray:
    """Participant ids as integer codes 0..k-1 in order of first appearance."""
    codes: dict[Hashable, int] = {}
    return np.array([codes.setdefault(p, len(codes)) for p in participants], dtype=int)


def _rows_by_participant(codes: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A function from drawn participant codes (with repeats) to all their rows, vectorised."""
    order = np.argsort(codes, kind="stable")  # rows grouped by participant
    sizes = np.bincount(codes)
    starts = np.cumsum(sizes) - sizes

    def rows_of(chosen: np.ndarray) -> np.ndarray:
        lengths = sizes[chosen]
        ends = np.cumsum(lengths)
        # output slot j of a drawn participant's block maps to order[starts[p] + offset in block]
        shift = np.repeat(starts[chosen] - (ends - lengths), lengths)
        return order[np.arange(ends[-1]) + shift]

    return rows_of


@dataclass(frozen=True)
class SumStatistic:
    """A statistic that sees the rows only through the sums of per-row columns: `per_row`
    (rows x columns) and `of_sums`, from summed columns (one row of sums per replicate) to one
    value each. Called with row indices (repeats allowed) it is an ordinary statistic;
    `participant_bootstrap` resamples it without a Python loop over replicates.

    >>> mean = SumStatistic(np.array([[0.0, 1], [1.0, 1], [0.5, 1]]), lambda s: s[:, 0] / s[:, 1])
    >>> mean(np.array([1, 1, 2]))
    0.8333333333333334
    """

    per_row: np.ndarray
    of_sums: Callable[[np.ndarray], np.ndarray]

    def __call__(self, rows: np.ndarray) -> float:
        return float(self.of_sums(self.per_row[rows].sum(axis=0, keepdims=True))[0])


def mean_statistic(values: Sequence[float] | np.ndarray) -> SumStatistic:
    """The mean of per-row `values` (0/1 hits, log-losses, differences) as a `SumStatistic`.

    >>> mean_statistic([0.0, 1.0, 0.5])(np.array([1, 1, 2]))
    0.8333333333333334
    """
    values = np.asarray(values, dtype=float).reshape(-1)
    return SumStatistic(np.column_stack([values, np.ones(values.size)]), _mean_of_sums)


def _mean_of_sums(sums: np.ndarray) -> np.ndarray:
    return sums[:, 0] / sums[:, 1]


# Replicate x participant counts per block (128 KiB): blocks that stay in cache resample several
# times faster than one large matrix, and the memory stays bounded however many participants.
COUNTS_AT_ONCE = 2**14


def _resampled_sums(statistic: SumStatistic, codes: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """`statistic` on each replicate of `draws` (replicates x drawn participant codes): how often
    each participant was drawn, times each participant's column sums."""
    k = draws.shape[1]
    totals = np.zeros((k, statistic.per_row.shape[1]))
    np.add.at(totals, codes, statistic.per_row)
    step = max(1, COUNTS_AT_ONCE // k)
    values = []
    for block in (draws[start : start + step] for start in range(0, len(draws), step)):
        cells = block + k * np.arange(len(block)).reshape(-1, 1)  # replicate r, participant c
        counts = np.bincount(cells.ravel(), minlength=block.size).reshape(block.shape)
        values.append(statistic.of_sums(counts.astype(float) @ totals))  # float @ float: BLAS
    return np.concatenate(values)


def participant_bootstrap(
    statistic: Callable[[np.ndarray], float],
    participants: Sequence[Hashable],
    replicates: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of `statistic` when participants, not rows, are resampled.

    `statistic` takes an integer array of row indices (with repeats) and returns a float;
    `participants` holds one id per row. Each replicate draws as many participants as there are,
    with replacement, and takes all rows of each draw. One participant (or none): the statistic
    on all rows, twice. A `SumStatistic` gets the same draws, hence the same interval, from
    matrix products (counts of draws times each participant's sums), not a call per replicate.

    >>> values = np.array([0.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    >>> low, high = participant_bootstrap(lambda rows: values[rows].mean(), [1, 1, 2, 2, 3, 3])
    >>> 0.0 <= low < 0.5 < high <= 1.0
    True
    """
    if not 0 < level < 1 or replicates < 1:
        raise ValueError(f"need 0 < level < 1 and replicates >= 1, got {level}, {replicates}")
    codes = _participant_codes(participants)
    k = int(codes.max()) + 1 if codes.size else 0
    if k < 2:
        value = float(statistic(np.arange(codes.size)))
        return value, value
    draws = np.random.default_rng(seed).integers(0, k, size=(replicates, k))
    if isinstance(statistic, SumStatistic):
        values = _resampled_sums(statistic, codes, draws)
    else:
        rows_of = _rows_by_participant(codes)
        values = np.array([statistic(rows_of(chosen)) for chosen in draws], dtype=float)
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def paired_difference(
    per_row_a: Sequence[float],
    per_row_b: Sequence[float],
    participants: Sequence[Hashable],
    replicates: int = 1000,
    seed: int = 0,
) -> dict:
    """Mean of a - b over rows (log-loss, 0/1 correctness) with a participant-bootstrap interval.

    >>> paired_difference([1, 1, 0, 1], [0, 1, 0, 0], ["x", "x", "y", "z"], replicates=200)
    {'difference': 0.5, 'ci': [0.0, 1.0], 'n': 4, 'participants': 3}
    """
    if not len(per_row_a) == len(per_row_b) == len(participants):
        raise ValueError(
            f"{len(per_row_a)} rows of a, {len(per_row_b)} of b, {len(participants)} participants"
        )
    differences = np.asarray(per_row_a, dtype=float) - np.asarray(per_row_b, dtype=float)
    k = len(set(participants))
    if not differences.size:
        return {"difference": None, "ci": None, "n": 0, "participants": 0}
    low, high = participant_bootstrap(mean_statistic(differences), participants, replicates, seed)
    mean = round(float(differences.mean()), 4)
    return {
        "difference": mean,
        "ci": [round(low, 4), round(high, 4)],
        "n": differences.size,
        "participants": k,
    }
