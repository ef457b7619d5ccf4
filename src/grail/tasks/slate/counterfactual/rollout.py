"""Counterfactual sessions: a recommender shows slates, a simulator picks videos.

For each sampled validation viewer, each recommender and each simulator, one session of `steps`
clicks starts at the viewer's own first video. At every step the recommender builds a slate from
what this session watched, the simulator gives its choice distribution over that slate, and the
click is drawn from it.

**Paired randomness.** Every simulator and every recommender of one viewer share the viewer's
uniform numbers (one per step; the click is the option where the cumulative distribution first
passes it), and a recommender's slate draws come from a generator seeded by (seed, viewer,
recommender, step) alone. So two simulators whose distributions agree make the same clicks and
see the same slates: a simulator equal to the truth reproduces the truth's sessions exactly, and
differences between simulators (and recommenders) are not blurred by independent noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from grail.tasks.slate.counterfactual.recommenders import RECOMMENDERS, Context, slate_size
from grail.tasks.slate.world import ChoiceModel, Video


@dataclass(frozen=True)
class Viewer:
    """A validation participant as a session starts: their survey profile, their opinion
    before (what a recommender may use), their hidden stance (the truth's alone; NaN in a real
    study) and the video their own first session (`session`) started with."""

    participant_id: str
    study: str
    issue: str
    profile: dict
    opinion_before: float | None
    stance: float
    start: str
    session: str = ""

    @property
    def side(self) -> int:
        """+1 when the stated opinion leans to the issue's pro side, else -1."""
        return 1 if (self.opinion_before if self.opinion_before is not None else 0.5) >= 0.5 else -1


@dataclass(frozen=True)
class State:
    """One step to decide: the viewer, the video playing, what was watched before it (oldest
    first) and the slate in display order."""

    viewer: Viewer
    current: str
    history: tuple[str, ...]
    slate: tuple[str, ...]


@dataclass
class Session:
    viewer: int  # index into the viewers
    recommender: str
    simulator: str
    watched: list[str] = field(default_factory=list)  # the start video, then each click
    positions: list[int] = field(default_factory=list)  # each click's display position, from 0


Simulator = Callable[[list[State]], list[np.ndarray]]  # distributions over each state's slate


@dataclass(frozen=True)
class Study:
    """The study's world as the rollouts need it. A real study (no known choice model) has
    no `model`, NaN slants and no opinion rule: only the ``replayed`` arm runs there."""

    videos: dict[str, Video]
    catalogue: dict[str, tuple[Video, ...]]  # per issue
    popularity_z: dict[str, float]
    model: ChoiceModel | None
    opinion_shift: float
    slate_sizes: dict[int, float]
    # video id -> the slates participants were shown after it (display order, one per showing)
    shown: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)


def truth_simulator(study: Study) -> Simulator:
    """The study's own choice model (the multinomial logit that drew every real click), with
    the viewer's hidden stance."""

    def distributions(states: list[State]) -> list[np.ndarray]:
        return [
            study.model.probabilities(
                s.viewer.stance,
                study.videos[s.current].slant,
                np.array([study.videos[v].slant for v in s.slate]),
                np.array([study.popularity_z[v] for v in s.slate]),
            )
            for s in states
        ]

    return distributions


def pick(distribution: np.ndarray, u: float) -> int:
    """The option where the cumulative distribution first passes `u` (inverse-CDF sampling).

    >>> pick(np.array([0.2, 0.5, 0.3]), 0.1), pick(np.array([0.2, 0.5, 0.3]), 0.69)
    (0, 1)
    """
    cumulative = np.cumsum(distribution) / distribution.sum()
    return int(min(np.searchsorted(cumulative, u, side="right"), len(distribution) - 1))


def roll_out(
    study: Study,
    viewers: list[Viewer],
    recommenders: list[str],
    simulators: dict[str, Simulator],
    steps: int,
    seed: int,
) -> list[Session]:
    """Every (viewer, recommender, simulator) session of `steps` clicks; each simulator is
    asked once per step for all its live sessions. A session whose recommender has nothing left
    to show stops early."""
    uniforms = np.random.default_rng([seed, 0]).random((len(viewers), steps))
    sessions = []
    for name, simulator in simulators.items():
        live = [
            Session(i, r, name, [viewer.start])
            for i, viewer in enumerate(viewers)
            for r in recommenders
        ]
        sessions += live
        for step in range(steps):
            states, asked = [], []
            for session in live:
                slate = show(study, viewers, session, step, seed, recommenders)
                if slate:
                    states.append(
                        State(
                            viewers[session.viewer],
                            session.watched[-1],
                            tuple(session.watched[:-1]),
                            tuple(slate),
                        )
                    )
                    asked.append(session)
            if not states:
                break
            for session, state, distribution in zip(asked, states, simulator(states), strict=True):
                k = pick(np.asarray(distribution, float), uniforms[session.viewer, step])
                session.watched.append(state.slate[k])
                session.positions.append(k)
            live = asked
    return sessions


def show(
    study: Study, viewers: list[Viewer], session: Session, step: int, seed: int, names: list[str]
) -> list[str]:
    """The slate the session's recommender shows at `step` (deterministic in the seed, the
    viewer, the recommender and the step)."""
    viewer = viewers[session.viewer]
    rng = np.random.default_rng([seed, 1, session.viewer, names.index(session.recommender), step])
    context = Context(
        study.catalogue[viewer.issue],
        study.videos[session.watched[-1]],
        tuple(session.watched),
        viewer.side,
        slate_size(rng, study.slate_sizes),
        study.shown.get(session.watched[-1], ()),
    )
    return RECOMMENDERS[session.recommender](context, rng)
