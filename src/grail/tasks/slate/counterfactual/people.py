"""The factual arm against people: simulators replay the slates the study's participants were
shown, and their sessions are compared with the sessions people actually had.

This is the one counterfactual-stage comparison a real study allows. Its truth is not a choice
model but what people did, so it needs no video's slant. It reads only what every cleaned row
holds, per viewer, then averaged over viewers:

- ``first_slot``: the share of the viewer's clicks on the slate's first displayed option;
- ``popularity``: the mean log10(1 + views) of the viewer's clicked videos (views where known);
- ``reach`` (over all viewers at once): the share of the issue's videos clicked at least once.

Each sampled viewer's own first session, step by step until its first dropped row, is the
people's session. Each simulator's session from the same start video under the ``replayed``
recommender is cut to at most as many clicks (it ends earlier when no participant was shown a
slate after the video it reached; each side's clicks are counted in the results).

A difference from people is taken over the viewers both sides have a value for (a viewer's
popularity is unknown when no clicked video has views), so it stays paired.
``reach`` has no interval: a bootstrap resample holds fewer distinct viewers than the sample,
so its union clicks fewer videos and the percentile interval lies below the estimate.
"""

from __future__ import annotations

import numpy as np

from grail.core.bootstrap import participant_bootstrap
from grail.tasks.slate.counterfactual.outcomes import statistic
from grail.tasks.slate.counterfactual.rollout import Session, Study
from grail.tasks.slate.world import Video

PEOPLE = "people"
REPLAYED = "replayed"
OBSERVED = ("first_slot", "popularity", "reach")
# The outcomes a verdict judges (reach is one number over all viewers, too noisy at these sizes).
JUDGED_ON_PEOPLE = ("first_slot", "popularity")


def shown_slates(rows: list[dict]) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Video id -> the slates shown after it, in display order, one per row, rows in order.

    >>> rows = [{"current_video": {"id": "a"}, "slate": [{"id": "b"}, {"id": "c"}]},
    ...         {"current_video": {"id": "a"}, "slate": [{"id": "c"}]}]
    >>> shown_slates(rows)
    {'a': (('b', 'c'), ('c',))}
    """
    shown: dict[str, list[tuple[str, ...]]] = {}
    for row in rows:
        shown.setdefault(row["current_video"]["id"], []).append(
            tuple(item["id"] for item in row["slate"])
        )
    return {video: tuple(slates) for video, slates in shown.items()}


def observed_study(rows: list[dict]) -> Study:
    """A real study's world from its cleaned rows: the videos the rows show (slant unknown:
    NaN), each issue's catalogue, the slate sizes people saw and the slates shown after each
    video. No choice model and no opinion rule: only the ``replayed`` arm runs on it."""
    videos: dict[str, Video] = {}
    sizes: dict[int, float] = {}
    issues: dict[str, dict[str, None]] = {}  # issue -> its video ids, in order (a set)
    for row in rows:
        sizes[row["n_options"]] = sizes.get(row["n_options"], 0) + 1
        for item in (row["current_video"], *row["slate"], *(row.get("history") or [])):
            issues.setdefault(row["issue"], {})[item["id"]] = None
            if item["id"] not in videos or videos[item["id"]].views is None:
                videos[item["id"]] = Video(
                    item["id"], row["issue"], float("nan"), item.get("title") or "",
                    item.get("channel") or "", item.get("duration_seconds") or 0,
                    item.get("views"), item.get("likes"), item.get("comments"),
                )  # fmt: skip
    return Study(
        videos=videos,
        catalogue={issue: tuple(videos[v] for v in ids) for issue, ids in issues.items()},
        popularity_z={},
        model=None,
        opinion_shift=float("nan"),
        slate_sizes={k: n / len(rows) for k, n in sorted(sizes.items())},
        shown=shown_slates(rows),
    )


def people_sessions(rows: list[dict], viewers, steps: int) -> list[Session]:
    """Each viewer's own first session (``viewer.session``), its first `steps` clicks, up to
    the first step the cleaning dropped (its next video was not in the slate): what people did
    under the arm the ``replayed`` recommender replays."""
    by_session: dict[str, dict[int, dict]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], {})[row["step_index"]] = row
    sessions = []
    for i, viewer in enumerate(viewers):
        # a viewer's session has its step 0 (grail.tasks.slate.counterfactual.stage.sample_viewers
        # samples session starts), so people make at least one click
        steps_of = by_session.get(viewer.session, {})
        session = Session(i, REPLAYED, PEOPLE, [viewer.start])
        for step in range(steps):
            row = steps_of.get(step)
            if row is None or row["current_video"]["id"] != session.watched[-1]:
                break
            session.watched.append(row["gold_id"])
            session.positions.append(row["gold_index"] - 1)
        sessions.append(session)
    return sessions


def observed_outcomes(session: Session, clicks: int, videos: dict) -> dict[str, float]:
    """The first `clicks` clicks' first-slot share and mean log10(1 + views) (NaN: no click,
    or no click with known views).

    >>> from types import SimpleNamespace as Fake
    >>> videos = {"a": Fake(views=9), "b": Fake(views=99), "c": Fake(views=None)}
    >>> observed_outcomes(Fake(watched=["s", "a", "b", "c"], positions=[0, 2, 0]), 3, videos)
    {'first_slot': 0.666667, 'popularity': 1.5}
    """
    positions = session.positions[:clicks]
    if not positions:
        return {"first_slot": float("nan"), "popularity": float("nan")}
    views = [videos[v].views for v in session.watched[1 : clicks + 1]]
    known = [np.log10(1 + v) for v in views if v is not None]
    return {
        "first_slot": round(float(np.mean([p == 0 for p in positions])), 6),
        "popularity": round(float(np.mean(known)), 6) if known else float("nan"),
    }


def observed_table(sessions: list[Session], people: list[Session], viewers, study) -> dict:
    """{simulator: cell} for the ``replayed`` sessions and people's (``people``), each
    simulated session cut to at most its viewer's number of people's clicks."""
    clicks = [len(s.positions) for s in people]
    table: dict = {}
    for s in [*people, *(s for s in sessions if s.recommender == REPLAYED)]:
        cell = table.setdefault(s.simulator, {})
        kept = clicks[s.viewer]
        for metric, value in observed_outcomes(s, kept, study.videos).items():
            cell.setdefault(metric, np.full(len(viewers), np.nan))[s.viewer] = value
        cell.setdefault("clicked", [set() for _ in viewers])[s.viewer] = set(
            s.watched[1 : kept + 1]
        )
        cell.setdefault("positions", [[] for _ in viewers])[s.viewer] = s.positions[:kept]
    return table


def number(value: float) -> float | None:
    """A finite value rounded for the results; None for NaN (JSON has no NaN)."""
    return round(float(value), 6) if np.isfinite(value) else None


def agreement(
    table: dict, viewers, catalogue: int, models: list[str], baselines: list[str],
    replicates: int = 500, seed: int = 0,
) -> dict:  # fmt: skip
    """Each simulator's outcomes beside people's, its difference from people with a
    viewer-bootstrap interval, and for each model (step 0 and the trained ones) and baseline
    whether the model is closer to people (|model - people| minus |baseline - people|, below
    zero: closer). A difference or verdict with fewer than two viewers that both sides have a
    value for is left out (``None``)."""
    participants = [v.participant_id for v in viewers]
    every = np.arange(len(viewers))
    people = table[PEOPLE]

    def interval(function) -> list[float] | None:
        low, high = participant_bootstrap(function, participants, replicates, seed)
        return [round(low, 6), round(high, 6)] if np.isfinite([low, high]).all() else None

    def difference(name: str, metric: str):
        """The mean difference over the viewers both sides have a value for, and their count."""
        if metric == "reach":

            def pooled(rows) -> float:
                return statistic(table[name], metric, rows, catalogue) - statistic(
                    people, metric, rows, catalogue
                )

            return pooled, len(viewers)
        a, b = table[name][metric], people[metric]
        both = np.isfinite(a) & np.isfinite(b)

        def paired(rows) -> float:
            kept = rows[both[rows]]
            return float((a[kept] - b[kept]).mean()) if len(kept) else float("nan")

        return paired, int(both.sum())

    cells, differences, verdicts = {}, {}, []
    for name, cell in table.items():
        for metric in OBSERVED:
            cells[f"{name}/{metric}"] = {"value": number(statistic(cell, metric, every, catalogue))}
            if name == PEOPLE:
                continue
            d, viewers_both = difference(name, metric)
            entry: dict = {"difference": number(d(every)) if viewers_both >= 2 else None}
            if metric != "reach" and entry["difference"] is not None:  # see the docstring
                entry["ci"] = interval(d)
            differences[f"{name}/{metric}"] = entry | {"viewers": viewers_both}
    for model, baseline, metric in (
        (m, b, x) for m in models for b in baselines for x in JUDGED_ON_PEOPLE
    ):
        (first, n_first), (second, n_second) = (
            difference(model, metric),
            difference(baseline, metric),
        )
        if min(n_first, n_second) < 2:
            continue

        def gap(rows, first=first, second=second) -> float:
            return abs(first(rows)) - abs(second(rows))

        ci = interval(gap)
        if ci is not None:
            verdicts.append(
                {"model": model, "baseline": baseline, "metric": metric, "gap": number(gap(every)),
                 "ci": ci}
            )  # fmt: skip
    clicks = {name: int(sum(len(p) for p in cell["positions"])) for name, cell in table.items()}
    return {"cells": cells, "differences": differences, "verdicts": verdicts, "clicks": clicks}
