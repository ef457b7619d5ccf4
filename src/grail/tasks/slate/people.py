"""The synthetic study's people (:mod:`grail.tasks.slate.simulate`): a participant's survey
answers and stance, their sessions (slates drawn from the recommendation trees, clicks drawn
from the known choice model) and their opinion after."""

from __future__ import annotations

import json

import numpy as np

from grail.tasks.slate.policy_issues import ISSUES
from grail.tasks.slate.tables import AGREE, IDEOLOGY
from grail.tasks.slate.world import (
    MARKER,
    MARKER_CHOSEN,
    ChoiceModel,
    Nuisance,
    OpinionRule,
    Study,
    Video,
)


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


def viewer_side(person: dict, issue: str) -> float:
    """The side rung's viewer: +1 whose party leans to the issue's pro side (gun_control:
    Republican; minimum_wage: Democrat), -1 the other party's, 0 an Independent.

    >>> viewer_side({"pid1": "Democrat"}, "gun_control"), viewer_side({"pid1": "Democrat"}, "x")
    (-1.0, 1.0)
    """
    party = {"Republican": 1.0, "Democrat": -1.0}.get(person["pid1"], 0.0)
    return party if issue == "gun_control" else -party


def marker_slate(
    rng: np.random.Generator, videos: dict[str, Video], issue: str, watched: list[str], size: int
) -> list[str]:
    """The marker rung's slate: one marked video and `size` - 1 unmarked ones of the issue not
    yet watched, in a random order."""
    pool = [v for v, video in videos.items() if video.issue == issue and v not in watched]
    marked = [v for v in pool if videos[v].title.startswith(MARKER)]
    plain = [v for v in pool if not videos[v].title.startswith(MARKER)]
    slate = [str(rng.choice(marked))] + [str(v) for v in rng.choice(plain, size - 1, replace=False)]
    return [slate[i] for i in rng.permutation(size)]


def marker_choice(marked: list[bool]) -> np.ndarray:
    """The marker rung's choice: the marked option with probability ``MARKER_CHOSEN``, the rest
    shared evenly, wherever each stands.

    >>> [round(float(p), 3) for p in marker_choice([False, True, False])]
    [0.05, 0.9, 0.05]
    """
    if len(marked) == 1:
        return np.ones(1)
    rest = (1 - MARKER_CHOSEN) / (len(marked) - 1)
    return np.array([MARKER_CHOSEN if m else rest for m in marked])


def click_probabilities(
    model: ChoiceModel,
    choices: str,
    stance: float,
    current_slant: float,
    slate: list[Video],
    popularity_z: dict[str, float],
) -> tuple[np.ndarray, np.ndarray]:
    """P(click each option) and what a position-blind predictor sees, as `choices` has people
    choose: the study's model (the side rung's reads the sign of each slant alone), or the
    marker rung's rule."""
    if choices == "marker":
        p = marker_choice([video.title.startswith(MARKER) for video in slate])
        return p, p
    slants = np.array([video.slant for video in slate])
    features = (
        stance,
        current_slant,
        np.sign(slants) if choices == "side" else slants,
        np.array([popularity_z[video.id] for video in slate]),
    )
    return model.probabilities(*features), model.position_blind(*features)


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
    choices: str = "study",
) -> tuple[dict, list[dict]]:
    """One session in the raw format and its per-step truth; people choose as `choices` says."""
    n_videos = 5 if rng.random() >= nuisance.incomplete_session else int(rng.integers(1, 5))
    current = seeds[rng.integers(len(seeds))]
    vids, orders, truth = [current.id], [], []
    for step in range(n_videos - 1):
        candidates = [r for r in current.recs if r not in vids]
        size = min(_draw_slate_size(rng, nuisance.slate_sizes), len(candidates))
        if choices == "marker":
            slate = marker_slate(rng, videos, issue, vids, size)
        else:
            slate = [str(v) for v in rng.choice(candidates, size, replace=False)]
        stance = viewer_side(person, issue) if choices == "side" else person["_stance"]
        p, blind = click_probabilities(
            model, choices, stance, current.slant, [videos[v] for v in slate], popularity_z
        )
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
                "stance": round(float(stance), 6),
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
