"""What the counterfactual sessions did, per recommender and simulator, and how far each
simulator is from the truth.

Per session (one per viewer, recommender and simulator), over its clicks (the start video
excluded), oriented toward the viewer's stated side (+ toward it, - against it):

- ``like_minded``: the share of clicks on videos slanted to the viewer's side;
- ``slant``: the mean slant of the clicked videos (-1 .. +1);
- ``drift``: the slant of the last click minus that of the first (does the session move?);
- ``opinion_shift``: the shift of the viewer's opinion the study's rule gives for the session
  (``shift`` times the mean slant of every watched video, the start included; noise-free).

Per recommender and simulator, ``reach``: the share of the issue's catalogue the sessions
clicked at least once (diversity). Every interval resamples viewers (participants), the same
draws for every simulator, so an error is paired with the truth it is measured against; reach
has none (a resample holds fewer distinct viewers, so its union reaches less).
"""

from __future__ import annotations

import numpy as np

from grail.core.bootstrap import participant_bootstrap

METRICS = ("like_minded", "slant", "drift", "opinion_shift", "reach")
TRUTH = "truth"


def session_outcomes(session, viewer, videos, opinion_shift: float) -> dict[str, float]:
    """One session's outcomes (NaN when it made no click).

    >>> from types import SimpleNamespace as Fake
    >>> videos = {k: Fake(slant=s) for k, s in {"a": 0.0, "b": 1.0, "c": -0.5}.items()}
    >>> session_outcomes(Fake(watched=["a", "b", "c"]), Fake(side=1), videos, 0.1)
    {'like_minded': 0.5, 'slant': 0.25, 'drift': -1.5, 'opinion_shift': 0.016667}
    """
    slants = np.array([videos[v].slant for v in session.watched]) * viewer.side
    clicks = slants[1:]
    if not len(clicks):
        return dict.fromkeys(METRICS[:-1], float("nan"))
    return {
        "like_minded": float((clicks > 0).mean()),
        "slant": float(clicks.mean()),
        "drift": float(clicks[-1] - clicks[0]),
        "opinion_shift": round(float(opinion_shift * slants.mean()), 6),
    }


def outcome_table(sessions, viewers, study) -> dict:
    """{simulator: {recommender: {metric: per-viewer values, "clicked": per-viewer sets}}}."""
    table: dict = {}
    for s in sessions:
        cell = table.setdefault(s.simulator, {}).setdefault(s.recommender, {})
        values = session_outcomes(s, viewers[s.viewer], study.videos, study.opinion_shift)
        for metric, value in values.items():
            cell.setdefault(metric, np.full(len(viewers), np.nan))[s.viewer] = value
        cell.setdefault("clicked", [set() for _ in viewers])[s.viewer] = set(s.watched[1:])
    return table


def statistic(cell: dict, metric: str, rows: np.ndarray, catalogue: int) -> float:
    """A metric of one (simulator, recommender) cell over the viewers `rows` (repeats allowed)."""
    if metric == "reach":
        return len(set().union(*(cell["clicked"][r] for r in rows))) / catalogue
    return float(np.nanmean(cell[metric][rows]))


def summarize(
    table: dict,
    viewers,
    catalogue: int,
    effects: list[tuple[str, str]],
    replicates: int = 1000,
    seed: int = 0,
) -> dict:
    """Each cell's value, each simulator's error against the truth and each recommender
    effect (A minus B) as each simulator predicts it, all with viewer-bootstrap intervals."""
    participants = [v.participant_id for v in viewers]
    every = np.arange(len(viewers))

    def interval(function) -> list[float]:
        low, high = participant_bootstrap(function, participants, replicates, seed)
        return [round(low, 6), round(high, 6)]

    truth = table[TRUTH]
    cells, errors, predicted = {}, {}, {}
    for simulator, by_recommender in table.items():
        for recommender, cell in by_recommender.items():
            for metric in METRICS:
                value = statistic(cell, metric, every, catalogue)
                key = f"{recommender}/{simulator}/{metric}"
                cells[key] = {"value": round(value, 6)}
                if simulator == TRUTH:
                    continue

                def error(rows, cell=cell, metric=metric, recommender=recommender):
                    return statistic(cell, metric, rows, catalogue) - statistic(
                        truth[recommender], metric, rows, catalogue
                    )

                errors[key] = {"error": round(error(every), 6)}
                if metric != "reach":  # biased under resampling (grail...counterfactual.people)
                    errors[key]["ci"] = interval(error)
        for a, b in effects:
            if a not in by_recommender or b not in by_recommender:
                continue
            for metric in METRICS:

                def effect(rows, cells=by_recommender, metric=metric, a=a, b=b):
                    return statistic(cells[a], metric, rows, catalogue) - statistic(
                        cells[b], metric, rows, catalogue
                    )

                def effect_error(rows, effect=effect, metric=metric, a=a, b=b):
                    return effect(rows) - (
                        statistic(truth[a], metric, rows, catalogue)
                        - statistic(truth[b], metric, rows, catalogue)
                    )

                entry = {"effect": round(effect(every), 6)}
                if metric != "reach":
                    entry["ci"] = interval(effect)
                if simulator != TRUTH:
                    entry["error"] = round(effect_error(every), 6)
                    if metric != "reach":
                        entry["error_ci"] = interval(effect_error)
                predicted[f"{a}-{b}/{simulator}/{metric}"] = entry
    return {"cells": cells, "errors": errors, "effects": predicted}


def closer_than(
    table: dict, viewers, catalogue: int, effect: tuple[str, str], metric: str, first: str,
    second: str, replicates: int = 1000, seed: int = 0,
) -> dict:  # fmt: skip
    """|effect error of `first`| minus |effect error of `second`| with its interval: below
    zero, `first` predicts the recommenders' effect closer to the truth. An effect ``(a,
    None)`` is the outcome under recommender `a` itself (its level, not a difference)."""
    a, b = effect

    def outcome(cells, rows) -> float:
        level = statistic(cells[a], metric, rows, catalogue)
        return level if b is None else level - statistic(cells[b], metric, rows, catalogue)

    def gap(rows) -> float:
        def error(name):
            return abs(outcome(table[name], rows) - outcome(table[TRUTH], rows))

        return error(first) - error(second)

    every = np.arange(len(viewers))
    low, high = participant_bootstrap(gap, [v.participant_id for v in viewers], replicates, seed)
    return {"gap": round(gap(every), 6), "ci": [round(low, 6), round(high, 6)]}
