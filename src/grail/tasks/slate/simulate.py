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
import functools
import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from grail.core.errors import GrailError
from grail.tasks.slate.policy_issues import ISSUES
from grail.tasks.slate.tables import AGREE, IDEOLOGY, TITLE_DECOR, TITLE_PARTS

ID_ALPHABET = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"))
SLANTS = (-1.0, -0.5, 0.0, 0.5, 1.0)


@dataclass(frozen=True)
class Study:
    name: str
    issue: str
    id_column: str
    participants: int


STUDIES = (
    Study("study1", "gun_control", "worker_id", 1650),
    Study("study2", "minimum_wage", "worker_id", 1679),
    Study("study3", "minimum_wage", "caseid", 2715),
)


@dataclass(frozen=True)
class ChoiceModel:
    """Multinomial logit over the displayed slate (the known truth behind every click)."""

    alignment: float = 4.0
    momentum: float = 0.5
    popularity: float = 0.35
    position: tuple[float, ...] = (1.2, 0.2, 0.0, -0.1, -0.2)

    def probabilities(
        self, stance: float, current_slant: float, slants: np.ndarray, popularity_z: np.ndarray
    ) -> np.ndarray:
        """P(click option j) for a slate in display order.

        >>> p = ChoiceModel().probabilities(1.0, 0.0, np.array([1.0, -1.0]), np.zeros(2))
        >>> bool(p[0] > 0.9) and bool(abs(p.sum() - 1) < 1e-12)
        True
        """
        utility = (
            self.alignment * stance * slants
            + self.momentum * current_slant * slants
            + self.popularity * popularity_z
            + np.array(self.position[: len(slants)])
        )
        weights = np.exp(utility - utility.max())
        return weights / weights.sum()

    def position_blind(
        self, stance: float, current_slant: float, slants: np.ndarray, popularity_z: np.ndarray
    ) -> np.ndarray:
        """P(click option j) as seen by a predictor that cannot see display positions (options
        shuffled): the click probability averaged over every order the slate could have had.

        >>> model = ChoiceModel(alignment=0.0, momentum=0.0, popularity=0.0)
        >>> [round(float(p), 6) for p in model.position_blind(0.0, 0.0, np.zeros(3), np.zeros(3))]
        [0.333333, 0.333333, 0.333333]
        """
        utility = (
            self.alignment * stance * slants
            + self.momentum * current_slant * slants
            + self.popularity * popularity_z
        )
        orders = _orders(len(slants))
        scores = utility[None, :] + np.array(self.position[: len(slants)])[orders]
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        return (weights / weights.sum(axis=1, keepdims=True)).mean(axis=0)


@functools.cache
def _orders(size: int) -> np.ndarray:
    """Every display position assignment of `size` options (row: option j -> position)."""
    return np.array(list(itertools.permutations(range(size))))


@dataclass(frozen=True)
class OpinionRule:
    """after = clip(before + shift * mean slant of watched videos + N(0, noise), 0, 1).

    The opinion index is 1 at the issue's "pro" side (pro gun rights; pro $15 minimum wage).
    """

    shift: float = 0.07
    noise: float = 0.035


@dataclass(frozen=True)
class Nuisance:
    """Rates of the real-data quirks the cleaner must survive."""

    incomplete_session: float = 0.07
    gold_not_in_slate: float = 0.015
    duplicate_session: float = 0.015
    no_survey: float = 0.01
    failed_attention: float = 0.03
    missing_metadata_row: float = 0.02
    missing_field: float = 0.04
    url_style_id: float = 0.05
    slate_sizes: dict[int, float] = field(
        default_factory=lambda: {2: 0.05, 3: 0.1, 4: 0.75, 5: 0.1}
    )


@dataclass(frozen=True)
class Video:
    id: str
    issue: str
    slant: float
    title: str
    channel: str
    duration: int
    views: int
    likes: int
    comments: int
    recs: tuple[str, ...] = ()


def _video_id(rng: np.random.Generator, taken: set[str]) -> str:
    """An 11-character YouTube-style id, unique even ignoring case (ids are matched that way)."""
    while True:
        vid = "".join(rng.choice(ID_ALPHABET, 11))
        if vid.lower() not in taken:
            taken.add(vid.lower())
            return vid


def make_catalogue(rng: np.random.Generator, per_issue: int = 206) -> dict[str, list[Video]]:
    """Videos per issue with slant-coded titles/channels, popularity, and a recommendation graph."""
    taken: set[str] = set()
    catalogue = {}
    for issue, parts in TITLE_PARTS.items():
        videos = []
        for k in range(per_issue):
            slant = SLANTS[k % len(SLANTS)]
            titles, channels = parts[slant]
            title = titles[rng.integers(len(titles))] + TITLE_DECOR[rng.integers(len(TITLE_DECOR))]
            views = int(np.exp(rng.normal(10.5, 1.8)))
            videos.append(
                Video(
                    id=_video_id(rng, taken),
                    issue=issue,
                    slant=slant,
                    title=title,
                    channel=channels[rng.integers(len(channels))],
                    duration=int(rng.integers(90, 1500)),
                    views=views,
                    likes=int(views * rng.uniform(0.005, 0.05)),
                    comments=int(views * rng.uniform(0.0005, 0.005)),
                )
            )
        ids = [v.id for v in videos]
        catalogue[issue] = [
            Video(
                **{
                    **asdict(v),
                    "recs": tuple(
                        rng.choice(
                            [i for i in ids if i != v.id], int(rng.integers(6, 9)), replace=False
                        )
                    ),
                }
            )
            for v in videos
        ]
    return catalogue


def _likert(rng: np.random.Generator, value: float, labels: list[str]) -> str:
    """Map a latent in [-1, 1] to one of ordered labels, with response noise."""
    position = (np.clip(value + rng.normal(0, 0.25), -1, 1) + 1) / 2 * (len(labels) - 1)
    return labels[int(round(position))]


def make_participant(
    rng: np.random.Generator, study: Study, index: int, nuisance: Nuisance
) -> dict:
    """Survey row (strings, as a labelled survey export) plus the latent stance under `_stance`."""
    ideology = float(np.clip(rng.normal(0, 0.55), -1, 1))  # -1 liberal .. +1 conservative
    lean = ideology if study.issue == "gun_control" else -ideology
    stance = float(np.clip(0.75 * lean + rng.normal(0, 0.35), -1, 1))  # +1 = the issue's pro side
    party = "Democrat" if ideology < -0.2 else "Republican" if ideology > 0.2 else "Independent"
    prefix = "A" if study.id_column == "worker_id" else ""
    row = {
        study.id_column: f"{prefix}{study.name[-1]}{index:06d}",
        "urlid": f"u{study.name[-1]}{rng.integers(16**8):08x}{index:05d}",
        "age": str(int(rng.integers(18, 80))),
        "gender": str(rng.choice(["Man", "Woman", "Non-binary"], p=[0.48, 0.5, 0.02])),
        "race": str(
            rng.choice(
                ["White", "Black", "Hispanic", "Asian", "Other"], p=[0.68, 0.11, 0.11, 0.06, 0.04]
            )
        ),
        "income": str(
            rng.choice(["Under $25k", "$25k-$50k", "$50k-$75k", "$75k-$100k", "Over $100k"])
        ),
        "pid1": party,
        "pid2": "Strong" if abs(ideology) > 0.5 else "Not very strong",
        "ideo1": _likert(rng, ideology, IDEOLOGY),
        "freq_youtube": str(rng.choice(["Daily", "Several times a week", "Weekly", "Rarely"])),
        "college": str(rng.choice(["Yes", "No"], p=[0.45, 0.55])),
        "pol_interest": str(
            rng.choice(["Very interested", "Somewhat interested", "Not very interested"])
        ),
        "religpew": str(
            rng.choice(["Protestant", "Catholic", "Nothing in particular", "Atheist", "Other"])
        ),
        "newsint": str(rng.choice(["Most of the time", "Some of the time", "Hardly at all"])),
        "attention_check": "fail" if rng.random() < nuisance.failed_attention else "pass",
        "_stance": stance,
    }
    before = float(np.clip((stance + 1) / 2 + rng.normal(0, 0.05), 0, 1))
    if study.issue == "gun_control":
        row |= {
            "gun_own": "Yes" if rng.random() < 0.25 + 0.35 * (stance + 1) / 2 else "No",
            "stricter_laws": _likert(rng, -stance, AGREE),
            "assault_ban": _likert(rng, -stance, AGREE),
            "handgun_ban": _likert(rng, -stance - 0.6, AGREE),
            "concealed_safe": _likert(rng, stance, AGREE),
            "gun_importance": _likert(
                rng, abs(stance) * 2 - 1, ["Not important", "Somewhat", "Very important"]
            ),
            "gun_enthusiasm": _likert(rng, stance, ["Not at all", "A little", "Very"]),
        }
    else:
        row |= {
            "minwage15_w1": _likert(rng, stance, AGREE),
            "mw_support_w1": _likert(rng, stance, AGREE),
        }
    row[ISSUES[study.issue].opinion_columns[0]] = round(before, 4)
    return row


def _draw_slate_size(rng: np.random.Generator, sizes: dict[int, float]) -> int:
    return int(rng.choice(list(sizes), p=list(sizes.values())))


def simulate_session(
    rng: np.random.Generator,
    model: ChoiceModel,
    nuisance: Nuisance,
    person: dict,
    seeds: list[Video],
    videos: dict[str, Video],
    popularity_z: dict[str, float],
    start_ms: int,
    session_id: str,
    issue: str,
) -> tuple[dict, list[dict]]:
    """One session in the raw format, plus per-step truth (Bayes-optimal probability)."""
    n_videos = 5 if rng.random() >= nuisance.incomplete_session else int(rng.integers(1, 5))
    current = seeds[rng.integers(len(seeds))]
    vids, orders, truth = [current.id], [], []
    for step in range(n_videos - 1):
        candidates = [r for r in current.recs if r not in vids]
        size = min(_draw_slate_size(rng, nuisance.slate_sizes), len(candidates))
        slate = [str(v) for v in rng.choice(candidates, size, replace=False)]
        features = (
            person["_stance"],
            current.slant,
            np.array([videos[v].slant for v in slate]),
            np.array([popularity_z[v] for v in slate]),
        )
        p = model.probabilities(*features)
        blind = model.position_blind(*features)
        pick = slate[rng.choice(len(slate), p=p)]
        off_slate = rng.random() < nuisance.gold_not_in_slate
        if off_slate:  # reached through search or the back button: not a slate choice
            pick = str(
                rng.choice(
                    [
                        v
                        for v, video in videos.items()
                        if video.issue == issue and v not in slate and v not in vids
                    ]
                )
            )
        truth.append(
            {
                "session_id": session_id,
                "step_index": step,
                "bayes_probability": round(float(p.max()), 6),
                # the choice model's most likely pick (the oracle's prediction) and the hit
                # probability of the best pick a position-blind predictor can make
                "bayes_best_id": slate[int(p.argmax())],
                "blind_probability": round(float(p[int(blind.argmax())]), 6),
                "gold_in_slate": not off_slate,
                "n_options": size,
                # the viewer's hidden stance and the choice model's probability of each option
                # (display order): the exact simulator ceiling (log-loss, Brier) per step
                "stance": round(float(person["_stance"]), 6),
                "choice_probabilities": json.dumps(
                    {video: round(float(q), 6) for video, q in zip(slate, p, strict=True)}
                ),
            }
        )
        orders.append(slate)
        vids.append(pick)
        current = videos[pick]
    totals = [videos[v].duration for v in vids]
    watch = [round(float(t * min(1.0, rng.beta(3, 1.2))), 1) for t in totals]
    starts = list(start_ms + np.cumsum([0] + [int(w * 1000) + 4000 for w in watch[:-1]]))
    session = {
        "sessionID": session_id,
        "urlid": person["urlid"],
        "issue": ISSUES[issue].raw,
        "topicID": f"{ISSUES[issue].raw}_{'pro' if videos[vids[0]].slant > 0 else 'anti'}",
        "vids": vids,
        "displayOrders": {f"{k + 1}-recs": slate for k, slate in enumerate(orders)},
        "vidWatchTimes": watch,
        "vidTotalLengths": totals,
        "vidStartTimes": [int(s) for s in starts],
        "vidEndTimes": [int(s + w * 1000) for s, w in zip(starts, watch, strict=True)],
        "percentVisible": [round(float(rng.uniform(0.6, 1.0)), 3) for _ in vids],
        "sessionFinished": n_videos == 5,
    }
    return session, truth


def opinion_after(
    rng: np.random.Generator, rule: OpinionRule, before: float, slants: list[float]
) -> float:
    """The known opinion update rule (see :class:`OpinionRule`)."""
    return float(np.clip(before + rule.shift * np.mean(slants) + rng.normal(0, rule.noise), 0, 1))


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


@dataclass(frozen=True)
class World:
    """What every study shares: the choice model, the catalogue and the seed videos."""

    model: ChoiceModel
    rule: OpinionRule
    nuisance: Nuisance
    catalogue: dict[str, list[Video]]  # per issue
    videos: dict[str, Video]
    popularity_z: dict[str, float]
    seeds: dict[str, list[Video]]


def make_world(rng: np.random.Generator) -> World:
    catalogue = make_catalogue(rng)
    videos = {v.id: v for vs in catalogue.values() for v in vs}
    log_views = np.log([v.views for v in videos.values()])
    popularity_z = {
        vid: float((np.log(v.views) - log_views.mean()) / log_views.std())
        for vid, v in videos.items()
    }
    seeds = {issue: [v for v in vs if abs(v.slant) == 1.0][:8] for issue, vs in catalogue.items()}
    return World(ChoiceModel(), OpinionRule(), Nuisance(), catalogue, videos, popularity_z, seeds)


def simulate(out: str | Path, participants: int | None = None, seed: int = 7) -> dict:
    """Write a synthetic study under `out`; returns the truth dictionary (also in truth.json).
    `participants` over the three studies (default: as the real study, 6044). `out` is written whole
    or not at all, and only if it is empty or an earlier study of ``grail simulate``
    (:func:`grail.core.outputs.atomic_folder`): never over a real export."""
    from grail.core.outputs import atomic_folder

    if participants is not None and participants < 1:
        raise GrailError(f"participants: expected at least 1, got {participants}")
    with atomic_folder(out, "simulate") as staging:
        return _simulate(staging, participants, seed)


def _simulate(out: Path, participants: int | None, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    world = make_world(rng)
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
