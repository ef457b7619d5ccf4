"""The simulator metrics of grail.tasks.slate.metrics: known values by hand, calibration, position
shares, total variation, and the participant (cluster) bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grail.core import bootstrap
from grail.tasks.slate import metrics as m

UNIFORM4 = [0.25, 0.25, 0.25, 0.25]


def _synthetic(rows: int, seed: int, sharpen: float = 1.0) -> tuple[list, list, list]:
    """Slates of 1..8 options with true choice probabilities; golds drawn from the truth, and the
    prediction the truth raised to `sharpen` (1: calibrated, > 1: overconfident)."""
    rng = np.random.default_rng(seed)
    truth, predicted, golds = [], [], []
    for length in rng.integers(1, 9, size=rows):
        p = rng.dirichlet(np.ones(length))
        q = p**sharpen / (p**sharpen).sum()
        truth.append(p.tolist())
        predicted.append(q.tolist())
        golds.append(int(rng.choice(length, p=p)) + 1)
    return truth, predicted, golds


# --- per-row losses ---------------------------------------------------------------------------


def test_uniform_over_four_options_by_hand():
    for gold in range(1, 5):
        assert m.row_log_loss(UNIFORM4, gold) == pytest.approx(math.log(4))
        assert m.row_brier(UNIFORM4, gold) == pytest.approx(0.75)
    assert m.expected_log_loss(UNIFORM4) == pytest.approx(math.log(4))
    assert m.expected_brier(UNIFORM4) == pytest.approx(0.75)


def test_certain_predictions_cost_nothing_when_right_and_the_most_when_wrong():
    assert m.row_log_loss([0.0, 1.0, 0.0], 2) == 0.0
    assert m.row_brier([0.0, 1.0, 0.0], 2) == 0.0
    assert m.row_log_loss([0.0, 1.0, 0.0], 1) == pytest.approx(-math.log(1e-6))
    assert m.row_log_loss([0.0, 1.0], 1, floor=0.01) == pytest.approx(-math.log(0.01))
    assert m.row_brier([0.0, 1.0, 0.0], 1) == pytest.approx(2.0)
    assert m.row_brier([0.7, 0.2, 0.1], 2) == pytest.approx(0.49 + 0.64 + 0.01)
    assert m.expected_log_loss([1.0, 0.0, 0.0]) == 0.0
    assert m.expected_brier([1.0]) == 0.0


def test_expected_losses_match_the_average_loss_of_choices_drawn_from_the_distribution():
    rng = np.random.default_rng(3)
    p = [0.6, 0.25, 0.1, 0.05]
    golds = rng.choice(4, size=40_000, p=p) + 1
    log_loss = np.mean([m.row_log_loss(p, int(g)) for g in golds])
    brier = np.mean([m.row_brier(p, int(g)) for g in golds])
    assert log_loss == pytest.approx(m.expected_log_loss(p), abs=0.01)
    assert brier == pytest.approx(m.expected_brier(p), abs=0.005)
    assert m.expected_log_loss(p) < m.expected_log_loss(UNIFORM4)


def test_cross_entropy_is_the_log_loss_expected_under_the_truth_and_least_at_the_truth():
    rng = np.random.default_rng(5)
    truth, model = [0.6, 0.25, 0.1, 0.05], [0.4, 0.3, 0.2, 0.1]
    golds = rng.choice(4, size=40_000, p=truth) + 1
    drawn = np.mean([m.row_log_loss(model, int(g)) for g in golds])
    assert drawn == pytest.approx(m.cross_entropy(truth, model), abs=0.01)
    # Gibbs: the truth itself scores its entropy, any other distribution more
    assert m.cross_entropy(truth, truth) == pytest.approx(m.expected_log_loss(truth))
    assert m.cross_entropy(truth, model) > m.cross_entropy(truth, truth)
    with pytest.raises(ValueError, match="3 true probabilities for 4 options"):
        m.cross_entropy([0.5, 0.25, 0.25], model)


def test_expected_log_loss_has_a_narrower_interval_than_the_realised_one():
    truth, predicted, golds = _synthetic(600, seed=6, sharpen=2.0)
    participants = np.repeat(np.arange(150), 4).tolist()
    scores = m.simulator_scores(predicted, golds, participants, replicates=200, truths=truth)
    expected = np.mean([m.cross_entropy(t, q) for t, q in zip(truth, predicted, strict=True)])
    assert scores["expected_log_loss"] == round(expected, 4)
    realised, known = scores["log_loss_ci"], scores["expected_log_loss_ci"]
    assert known[1] - known[0] < realised[1] - realised[0]
    assert "expected_log_loss" not in m.simulator_scores(predicted, golds, participants, 50)


@pytest.mark.parametrize("gold", [0, 5, -1])
def test_a_gold_outside_the_slate_is_refused(gold):
    with pytest.raises(ValueError, match="not an option"):
        m.row_log_loss(UNIFORM4, gold)
    with pytest.raises(ValueError, match="not an option"):
        m.row_brier(UNIFORM4, gold)
    with pytest.raises(ValueError, match="not an option"):
        m.calibration_error([UNIFORM4], [gold])


# --- calibration --------------------------------------------------------------------------------


def test_calibration_error_by_hand():
    # pairs (0.8, 1) (0.2, 0) (0.8, 0) (0.2, 1): bins 2 and 8 each predict 0.2/0.8, observe 0.5
    assert m.calibration_error([[0.8, 0.2], [0.8, 0.2]], [1, 2]) == pytest.approx(0.3)
    assert m.calibration_error([[0.8, 0.2], [0.8, 0.2]], [1, 1]) == pytest.approx(0.2)
    assert m.calibration_error([[1.0, 0.0]], [1]) == 0.0  # p = 1 falls in the last bin
    # one bin: every row's probabilities and its outcomes both sum to 1, so the gap is 0
    assert m.calibration_error([[0.9, 0.1], [0.3, 0.7]], [2, 2], bins=1) == pytest.approx(0.0)


def test_a_calibrated_simulator_has_a_small_ece_and_an_overconfident_one_a_larger():
    _, calibrated, golds = _synthetic(20_000, seed=1)
    _, overconfident, golds_again = _synthetic(20_000, seed=1, sharpen=3.0)
    assert golds == golds_again
    good, bad = m.calibration_error(calibrated, golds), m.calibration_error(overconfident, golds)
    assert good < 0.01
    assert bad > 0.05
    assert bad > 5 * good


def test_calibration_error_refuses_mismatched_lengths_and_empty_rows():
    with pytest.raises(ValueError, match="golds for"):
        m.calibration_error([UNIFORM4, UNIFORM4], [1])
    with pytest.raises(ValueError, match="empty distribution"):
        m.calibration_error([UNIFORM4, []], [1, 1])
    with pytest.raises(ValueError, match="bins"):
        m.calibration_error([UNIFORM4], [1], bins=0)


# --- position shares and total variation --------------------------------------------------------


def test_position_shares_average_the_probability_per_display_position():
    shares = m.position_shares([[1.0], [0.5, 0.5], [0.1, 0.2, 0.3, 0.4]])
    assert len(shares) == 8
    assert shares[:4] == pytest.approx([1.6 / 3, 0.7 / 3, 0.1, 0.4 / 3])
    assert shares[4:] == [0.0] * 4
    assert sum(shares) == pytest.approx(1.0)
    assert m.position_shares([]) == [0.0] * 8
    with pytest.raises(ValueError, match="more than"):
        m.position_shares([[0.5, 0.5, 0.0]], max_positions=2)


def test_gold_shares_count_the_chosen_positions():
    assert m.gold_shares([1, 1, 1, 3]) == [0.75, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert m.gold_shares([2], max_positions=2) == [0.0, 1.0]
    assert m.gold_shares([]) == [0.0] * 8
    with pytest.raises(ValueError, match="1..8"):
        m.gold_shares([9])


def test_total_variation_of_identical_is_zero_and_of_disjoint_is_one():
    assert m.total_variation([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]) == 0.0
    assert m.total_variation([1.0, 0.0], [0.0, 1.0]) == 1.0
    assert m.total_variation([0.5, 0.5, 0.0], [0.0, 0.5, 0.5]) == pytest.approx(0.5)
    assert m.total_variation({"a": 0.5, "b": 0.5}, {"b": 0.5, "a": 0.5}) == 0.0
    assert m.total_variation({"a": 1.0}, {"b": 0.4, "c": 0.6}) == pytest.approx(1.0)
    assert m.total_variation({"a": 0.6, "b": 0.4}, {"a": 0.4, "c": 0.6}) == pytest.approx(0.6)


def test_total_variation_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="lengths 2 and 3"):
        m.total_variation([0.5, 0.5], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="two lists or two dicts"):
        m.total_variation({"a": 1.0}, [1.0])


# --- participant bootstrap ----------------------------------------------------------------------


def _clustered(participants: int, rows_each: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """Per-row 0/1 values that are the same for all rows of a participant (fully correlated)."""
    rng = np.random.default_rng(seed)
    per_participant = rng.integers(0, 2, size=participants).astype(float)
    return np.repeat(per_participant, rows_each), np.repeat(np.arange(participants), rows_each)


def _mean_of(values: np.ndarray):
    return lambda rows: float(values[rows].mean())


def test_the_bootstrap_is_reproducible_with_a_seed_and_changes_with_another():
    values, participants = _clustered(30, 4, seed=0)
    values = values + np.random.default_rng(1).normal(size=values.size)
    first = bootstrap.participant_bootstrap(_mean_of(values), participants, replicates=300, seed=5)
    again = bootstrap.participant_bootstrap(_mean_of(values), participants, replicates=300, seed=5)
    other = bootstrap.participant_bootstrap(_mean_of(values), participants, replicates=300, seed=6)
    assert first == again
    assert first != other
    assert first[0] < values.mean() < first[1]


def test_each_replicate_takes_all_rows_of_as_many_participants_as_there_are():
    participants = ["a", "b", "a", "c", "b", "a", "d", "c", "e"]  # unequal, interleaved
    seen = []

    def record(rows: np.ndarray) -> float:
        seen.append(rows.copy())
        return 0.0

    bootstrap.participant_bootstrap(record, participants, replicates=50, seed=0)
    assert len(seen) == 50
    ids = np.array(participants)
    for rows in seen:
        counts = np.bincount(rows, minlength=len(participants))
        draws = 0
        for person in set(participants):
            mine = counts[ids == person]
            assert len(set(mine)) == 1, "a drawn participant brings all of their rows"
            draws += mine[0]
        assert draws == 5  # five distinct participants, five draws


def test_one_participant_or_no_rows_gives_the_value_on_all_rows():
    values = np.array([0.2, 0.4, 0.9])
    assert bootstrap.participant_bootstrap(_mean_of(values), ["p", "p", "p"]) == pytest.approx(
        (0.5, 0.5)
    )
    assert bootstrap.participant_bootstrap(lambda rows: float(len(rows)), []) == (0.0, 0.0)
    with pytest.raises(ValueError, match="level"):
        bootstrap.participant_bootstrap(_mean_of(values), [1, 2, 3], level=1.5)


def test_the_interval_covers_the_true_mean_about_as_often_as_its_level():
    true_mean, covered, runs = 0.3, 0, 100
    for run in range(runs):
        rng = np.random.default_rng(100 + run)
        effect = np.repeat(rng.normal(0, 1, size=40), 5)  # 40 participants, 5 rows each
        values = true_mean + effect + rng.normal(0, 1, size=effect.size)
        participants = np.repeat(np.arange(40), 5)
        low, high = bootstrap.participant_bootstrap(
            _mean_of(values), participants, replicates=300, seed=run
        )
        covered += low <= true_mean <= high
    assert 0.85 <= covered / runs <= 1.0


def test_correlated_rows_give_a_wider_participant_interval_than_a_row_level_one():
    values, participants = _clustered(40, 10, seed=2)
    by_participant = bootstrap.participant_bootstrap(_mean_of(values), participants, seed=0)
    by_row = bootstrap.participant_bootstrap(_mean_of(values), np.arange(values.size), seed=0)
    width_participant = by_participant[1] - by_participant[0]
    width_row = by_row[1] - by_row[0]
    # ten identical rows per participant: about sqrt(10) ~ 3.2 times wider
    assert width_participant > 2 * width_row


def test_the_bootstrap_is_fast_enough_for_thousands_of_rows():
    rng = np.random.default_rng(0)
    values = rng.random(2_500)
    participants = rng.integers(0, 500, size=2_500)
    low, high = bootstrap.participant_bootstrap(_mean_of(values), participants, replicates=1000)
    assert low < values.mean() < high


# --- simulator scores ---------------------------------------------------------------------------


def test_simulator_scores_agree_with_the_single_metrics():
    _, predicted, golds = _synthetic(600, seed=4, sharpen=2.0)
    participants = np.repeat(np.arange(150), 4).tolist()
    scores = m.simulator_scores(predicted, golds, participants, replicates=200)
    log_loss = np.mean([m.row_log_loss(p, g) for p, g in zip(predicted, golds, strict=True)])
    brier = np.mean([m.row_brier(p, g) for p, g in zip(predicted, golds, strict=True)])
    position_tv = m.total_variation(m.position_shares(predicted), m.gold_shares(golds))
    assert scores["n"] == 600
    assert scores["log_loss"] == round(log_loss, 4)
    assert scores["brier"] == round(brier, 4)
    assert scores["ece"] == round(m.calibration_error(predicted, golds), 4)
    assert scores["position_tv"] == round(position_tv, 4)
    for name in ("log_loss", "brier", "ece", "position_tv"):
        low, high = scores[f"{name}_ci"]
        assert low < high
    for name in ("log_loss", "brier"):
        assert scores[f"{name}_ci"][0] <= scores[name] <= scores[f"{name}_ci"][1]
    assert scores == m.simulator_scores(predicted, golds, participants, replicates=200)


def test_the_resampled_ece_and_position_tv_are_recomputed_on_the_resampled_rows():
    _, predicted, golds = _synthetic(50, seed=8, sharpen=2.0)
    matrix, mask = m._padded(predicted, 8)
    statistics = m._simulator_statistics(matrix, mask, np.array(golds))
    rows = np.array([0, 0, 0, 3, 7, 7, 12, 49, 49])
    again = [predicted[i] for i in rows]
    golds_again = [golds[i] for i in rows]
    assert statistics["ece"](rows) == pytest.approx(m.calibration_error(again, golds_again))
    tv = m.total_variation(m.position_shares(again), m.gold_shares(golds_again))
    assert statistics["position_tv"](rows) == pytest.approx(tv)


def test_simulator_scores_flag_a_collapse_onto_the_first_position():
    _, _, golds = _synthetic(400, seed=5)
    collapsed = [[0.9] + [0.1 / 7] * 7 for _ in golds]
    scores = m.simulator_scores(collapsed, golds, list(range(400)), replicates=100)
    assert scores["top_position"] == 1
    assert scores["top_share"] == pytest.approx(0.9)
    assert scores["human_top_share"] < 0.6
    assert scores["position_tv"] > 0.3


def test_simulator_scores_refuse_mismatched_lengths_and_handle_no_rows():
    with pytest.raises(ValueError, match="participants for"):
        m.simulator_scores([UNIFORM4], [1], ["a", "b"])
    with pytest.raises(ValueError, match="golds for"):
        m.simulator_scores([UNIFORM4], [1, 2], ["a"])
    empty = m.simulator_scores([], [], [])
    assert empty["n"] == 0 and empty["log_loss"] is None and empty["ece_ci"] is None


# --- paired difference --------------------------------------------------------------------------


def test_paired_difference_favours_the_clearly_better_system():
    truth, sharp, golds = _synthetic(800, seed=6)
    participants = np.repeat(np.arange(200), 4).tolist()
    uniform = [[1 / len(p)] * len(p) for p in truth]
    good = [m.row_log_loss(p, g) for p, g in zip(sharp, golds, strict=True)]
    bad = [m.row_log_loss(p, g) for p, g in zip(uniform, golds, strict=True)]
    result = bootstrap.paired_difference(good, bad, participants)
    assert result["n"] == 800 and result["participants"] == 200
    assert result["difference"] < 0
    assert result["ci"][0] <= result["difference"] <= result["ci"][1] < 0
    flipped = bootstrap.paired_difference(bad, good, participants)
    assert flipped["difference"] == -result["difference"]
    assert flipped["ci"][0] > 0


def test_paired_difference_of_correctness_and_of_equal_systems():
    rng = np.random.default_rng(9)
    participants = np.repeat(np.arange(100), 5)
    a = (rng.random(500) < 0.8).astype(int)
    b = (rng.random(500) < 0.5).astype(int)
    result = bootstrap.paired_difference(a, b, participants, replicates=500)
    assert result["difference"] == pytest.approx(a.mean() - b.mean(), abs=1e-4)
    assert result["ci"][0] > 0
    same = bootstrap.paired_difference(a, a, participants, replicates=100)
    assert same["difference"] == 0.0 and same["ci"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="rows of a"):
        bootstrap.paired_difference([1, 0], [1], [1, 2])
