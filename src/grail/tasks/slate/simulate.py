"""Synthetic study generator: a raw export shaped like the PNAS 2025 study, from a known model.

Run: ``grail simulate --out raw/ [--participants 6044] [--seed 7]``.

Layout written (the same layout ``grail clean`` reads; see docs/data.md#raw-export-layout)::

    raw/sessions.json                   list of sessions (vids, displayOrders, watch times, ...)
    raw/surveys/<study>.csv             one row per participant, joined on urlid
    raw/trees/<issue>/<originId>.csv    recommendation tree per seed video (originId, rec1..recN)
    raw/video_metadata.csv              id, title, channel, duration, views, likes, comments
    raw/truth.json                      the generating model and exact Bayes-optimal accuracies
    raw/truth_steps.csv                 per step: the Bayes-optimal probability, for exact ceilings

The next click is drawn from a multinomial logit over the slate: utility = alignment * stance *
slant + momentum * slant(current) * slant + popularity * z(log views) + position[slot]. A viewer's
stance shows in the survey fields the prompt prints; a video's slant shows in its title and channel.
The Bayes-optimal accuracy of a step is max_j P(j); ``truth.json`` averages it exactly over the
steps that ``grail clean`` keeps. Same seed, same bytes.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from grail.core.errors import GrailError
from grail.tasks.slate.people import make_participant, opinion_after, simulate_session
from grail.tasks.slate.policy_issues import ISSUES
from grail.tasks.slate.world import STUDIES, Nuisance, Study, Video, World, make_world


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(
            handle, fieldnames=columns, extrasaction="ignore", lineterminator="\n"
        )
        writer.writeheader()
        writer.writerows(rows)


def _iso_duration(seconds: int) -> str:
    """YouTube API style duration.

    >>> _iso_duration(754)
    'PT12M34S'
    """
    minutes, sec = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return "PT" + (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "") + f"{sec}S"


def write_catalogue(
    out: Path,
    rng: np.random.Generator,
    nuisance: Nuisance,
    catalogue: dict[str, list[Video]],
    seeds: dict[str, list[Video]],
) -> None:
    """video_metadata.csv (with quirks: URL-style ids, missing fields and rows) and the trees."""
    rows = []
    for video in (v for videos in catalogue.values() for v in videos):
        if rng.random() < nuisance.missing_metadata_row:
            continue  # known only from the recommendation trees
        row = {
            "id": video.id,
            "title": video.title,
            "channel": video.channel,
            "duration": _iso_duration(video.duration),
            "views": video.views,
            "likes": video.likes,
            "comments": video.comments,
        }
        if rng.random() < nuisance.url_style_id:
            row["id"] = f"https://www.youtube.com/watch?v={video.id}"
        for name in ("channel", "duration", "likes", "comments"):
            if rng.random() < nuisance.missing_field:
                row[name] = ""
        rows.append(row)
    _write_csv(
        out / "video_metadata.csv",
        rows,
        ["id", "title", "channel", "duration", "views", "likes", "comments"],
    )
    for issue, issue_seeds in seeds.items():
        by_id = {v.id: v for v in catalogue[issue]}
        for seed in issue_seeds:
            reached, frontier = [seed.id], [seed.id]
            for _ in range(4):
                frontier = [r for v in frontier for r in by_id[v].recs if r not in reached]
                reached += list(dict.fromkeys(frontier))
            n_recs = max(len(v.recs) for v in catalogue[issue])
            tree_rows = [
                {
                    "originId": by_id[v].id,
                    "title": by_id[v].title,
                    "channel": by_id[v].channel,
                    "duration": by_id[v].duration,
                    **{f"rec{k + 1}": r for k, r in enumerate(by_id[v].recs)},
                }
                for v in reached
            ]
            _write_csv(
                out / "trees" / issue / f"{seed.id}.csv",
                tree_rows,
                ["originId", "title", "channel", "duration"]
                + [f"rec{k + 1}" for k in range(n_recs)],
            )


def simulate(
    out: str | Path, participants: int | None = None, seed: int = 7, choices: str = "study"
) -> dict:
    """Write a synthetic study under `out`; returns the truth dictionary (also in truth.json).
    `participants` over the three studies (default: as the real study, 6044). `out` is written whole
    or not at all, and only if it is empty or an earlier study of ``grail simulate``
    (:func:`grail.core.outputs.atomic_folder`): never over a real export. `choices`: how
    people choose (:data:`grail.tasks.slate.world.CHOICES`: the study's model, or a rung of
    the learnability ladder)."""
    from grail.core.outputs import atomic_folder

    if participants is not None and participants < 1:
        raise GrailError(f"participants: expected at least 1, got {participants}")
    with atomic_folder(out, "simulate") as staging:
        return _simulate(staging, participants, seed, choices)


def _simulate(out: Path, participants: int | None, seed: int, choices: str) -> dict:
    rng = np.random.default_rng(seed)
    world = make_world(rng, choices)
    scale = 1.0 if participants is None else participants / sum(s.participants for s in STUDIES)
    sessions, truth_steps, studies_truth = [], [], {}
    clock = 1_571_000_000_000  # October 2019, in ms
    for study in STUDIES:
        people = [
            make_participant(rng, study, i, world.nuisance)
            for i in range(max(1, round(study.participants * scale)))
        ]
        clock, study_sessions, steps = simulate_study(rng, world, study, people, clock)
        sessions += study_sessions
        truth_steps += steps
        survey = [p for p in people if p["_has_survey"]]
        columns = [c for c in people[0] if not c.startswith("_")]
        _write_csv(out / "surveys" / f"{study.name}.csv", survey, columns)
        studies_truth[study.name] = study_truth(study, people, [s for s in steps if s["kept"]])
    order = rng.permutation(len(sessions))  # file order is not time order: dedup must use times
    with (out / "sessions.json").open("w", encoding="utf-8") as handle:
        json.dump([sessions[i] for i in order], handle, ensure_ascii=False, indent=None)
    write_catalogue(out, rng, world.nuisance, world.catalogue, world.seeds)
    return write_truth(out, seed, world, truth_steps, studies_truth)


def simulate_study(
    rng: np.random.Generator, world: World, study: Study, people: list[dict], clock: int
) -> tuple[int, list[dict], list[dict]]:
    """Every session of one study's participants; returns the clock, sessions and steps (each
    step marked ``kept`` when ``grail clean`` keeps it). Fills each person's opinion after."""
    sessions, steps = [], []
    for person in people:
        has_survey = rng.random() >= world.nuisance.no_survey
        person["_has_survey"] = has_survey
        n_sessions = 2 if rng.random() < world.nuisance.duplicate_session else 1
        for k in range(n_sessions):
            clock += int(rng.integers(1, 600_000))
            sid = f"s{rng.integers(16**12):012x}"
            session, session_steps = simulate_session(
                rng,
                world.model,
                world.nuisance,
                person,
                world.seeds[study.issue],
                world.videos,
                world.popularity_z,
                clock,
                sid,
                study.issue,
                world.choices,
            )
            sessions.append(session)
            kept_session = k == 0 and has_survey and person["attention_check"] == "pass"
            for step in session_steps:
                step["kept"] = kept_session and step["gold_in_slate"]
            steps += session_steps
            if k == 0:  # the opinion after the study follows the first (kept) session
                before_col, after_col = ISSUES[study.issue].opinion_columns
                watched = [world.videos[v].slant for v in session["vids"]]
                after = opinion_after(rng, world.rule, person[before_col], watched)
                person[after_col] = round(after, 4)
    return clock, sessions, steps


def study_truth(study: Study, people: list[dict], kept_steps: list[dict]) -> dict:
    """The study's exact ceilings over the steps ``grail clean`` keeps."""
    by_size: dict[int, list[float]] = {}
    for step in kept_steps:
        by_size.setdefault(step["n_options"], []).append(step["bayes_probability"])
    return {
        "issue": study.issue,
        "participants": len(people),
        "kept_steps": len(kept_steps),
        "bayes_optimal_accuracy": round(
            float(np.mean([s["bayes_probability"] for s in kept_steps])), 6
        ),
        "position_blind_accuracy": round(
            float(np.mean([s["blind_probability"] for s in kept_steps])), 6
        ),
        "bayes_optimal_accuracy_by_slate_size": {
            str(size): round(float(np.mean(p)), 6) for size, p in sorted(by_size.items())
        },
    }


TRUTH_STEP_COLUMNS = [
    "session_id",
    "step_index",
    "bayes_probability",
    "bayes_best_id",
    "blind_probability",
    "gold_in_slate",
    "n_options",
    "kept",
    "stance",
    "choice_probabilities",
]


def write_truth(
    out: Path, seed: int, world: World, truth_steps: list[dict], studies_truth: dict
) -> dict:
    """``truth_steps.csv`` and ``truth.json``: the generating model and the exact ceilings."""
    _write_csv(out / "truth_steps.csv", truth_steps, TRUTH_STEP_COLUMNS)
    nuisance = world.nuisance
    truth = {
        "seed": seed,
        "choices": world.choices,
        "choice_model": asdict(world.model),
        "opinion_rule": asdict(world.rule),
        "opinion_index": "1 = the issue's pro side (gun_control: gun rights; minimum_wage: $15)",
        "nuisance": asdict(nuisance)
        | {"slate_sizes": {str(k): v for k, v in nuisance.slate_sizes.items()}},
        "studies": studies_truth,
        "video_slant": {v.id: v.slant for v in world.videos.values()},
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
    return truth
