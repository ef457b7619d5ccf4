"""The synthetic study's world (:mod:`grail.tasks.slate.simulate`): the three studies, the known
choice model (a multinomial logit over the slate), the opinion rule, the nuisance rates, and the
video catalogue with its slants, popularity and seed videos."""

from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass, field

import numpy as np

from grail.tasks.slate.tables import TITLE_DECOR, TITLE_PARTS

# How people choose (grail simulate --choices): the study's full choice model, or a rung of the
# learnability ladder (bench/learnability.py) whose rule a reader finds in one lookup or two.
CHOICES = ("study", "side", "marker")
MARKER = "Featured:"  # the marker rung's word, opening a marked video's title
MARKER_CHOSEN = 0.9  # P(the marked option) on the marker rung, wherever it stands
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


def make_catalogue(
    rng: np.random.Generator, per_issue: int = 206, marked: bool = False
) -> dict[str, list[Video]]:
    """Videos per issue with slant-coded titles/channels, popularity, and a recommendation graph;
    with `marked`, every other video's title opens with :data:`MARKER` (the same draws: the
    catalogue is otherwise the study's)."""
    taken: set[str] = set()
    catalogue = {}
    for issue, parts in TITLE_PARTS.items():
        videos = []
        for k in range(per_issue):
            slant = SLANTS[k % len(SLANTS)]
            titles, channels = parts[slant]
            title = titles[rng.integers(len(titles))] + TITLE_DECOR[rng.integers(len(TITLE_DECOR))]
            title = f"{MARKER} {title}" if marked and k % 2 else title
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
    choices: str = "study"  # how people choose (CHOICES)


# the side rung: the viewer's party side against each video's side, nothing else
SIDE_MODEL = ChoiceModel(alignment=3.0, momentum=0.0, popularity=0.0, position=(0.0,) * 5)


def make_world(rng: np.random.Generator, choices: str = "study") -> World:
    """The study's world; `choices` other than ``study`` makes a rung of the learnability
    ladder (:data:`CHOICES`): ``side`` chooses by :data:`SIDE_MODEL`, ``marker`` marks every
    other video (:func:`make_catalogue`) and chooses the marked option of each slate with
    probability :data:`MARKER_CHOSEN`."""
    if choices not in CHOICES:
        raise ValueError(f"choices {choices!r}: use one of {', '.join(CHOICES)}")
    catalogue = make_catalogue(rng, marked=choices == "marker")
    videos = {v.id: v for vs in catalogue.values() for v in vs}
    log_views = np.log([v.views for v in videos.values()])
    popularity_z = {
        vid: float((np.log(v.views) - log_views.mean()) / log_views.std())
        for vid, v in videos.items()
    }
    seeds = {issue: [v for v in vs if abs(v.slant) == 1.0][:8] for issue, vs in catalogue.items()}
    model = SIDE_MODEL if choices == "side" else ChoiceModel()
    return World(model, OpinionRule(), Nuisance(), catalogue, videos, popularity_z, seeds, choices)
