"""Recommenders a simulated viewer can be shown: plain policies over the study's catalogue that
build the next slate from what the viewer watched.

A recommender is a function ``(context, rng) -> video ids in display order`` registered in
:data:`RECOMMENDERS` (add one there and ``grail counterfactual --recommenders`` takes its name).
Every recommender draws its slate size from the study's own distribution
(``truth.json``'s ``nuisance.slate_sizes``), never repeats a video the viewer has watched, and
is deterministic given its generator; ``replayed`` alone shows slates people were shown, as
they were shown. What "like-minded" means comes from what a recommender
could know: the viewer's stated opinion before the study (``opinion_before`` >= 0.5: the issue's
pro side), never the hidden stance the truth uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from grail.tasks.slate.world import Video


@dataclass(frozen=True)
class Context:
    """What a recommender sees: the issue's catalogue, the video playing, the videos watched so
    far (the one playing last), the viewer's side (+1: the issue's pro side, -1: anti), the
    slate size it must fill and the slates the study's participants were shown after the video
    playing (in display order, one per time shown)."""

    catalogue: tuple[Video, ...]
    current: Video
    watched: tuple[str, ...]
    side: int
    size: int
    shown: tuple[tuple[str, ...], ...] = ()

    def unseen(self, videos) -> list[Video]:
        return [v for v in videos if v.id not in self.watched]


Recommender = Callable[[Context, np.random.Generator], list[str]]


def _draw(rng: np.random.Generator, pool: list[Video], size: int) -> list[str]:
    """`size` videos of `pool` (all of a smaller pool) in a random display order."""
    picks = rng.choice(len(pool), min(size, len(pool)), replace=False)
    return [pool[int(k)].id for k in picks]


def factual(context: Context, rng: np.random.Generator) -> list[str]:
    """The study's own arm: the playing video's recommendation tree (its ``recs``), as the
    synthetic study drew its slates (:func:`grail.tasks.slate.people.simulate_session`)."""
    by_id = {v.id: v for v in context.catalogue}
    return _draw(rng, context.unseen(by_id[r] for r in context.current.recs), context.size)


def replayed(context: Context, rng: np.random.Generator) -> list[str]:
    """The slates people were shown: one of those the study's participants saw after the video
    playing (a slate shown more often is replayed more often), as they saw it, in its display
    order, a video the viewer watched included; nothing when no participant was shown a slate
    after it. The one arm a real study can score: it needs no video's slant, and a click's
    position means what it meant to people
    (docs/counterfactual.md#the-factual-arm-against-people)."""
    if not context.shown:
        return []
    return list(context.shown[int(rng.integers(len(context.shown)))])


def like_minded(context: Context, rng: np.random.Generator) -> list[str]:
    """Videos slanted to the viewer's side (slant times side > 0), at random."""
    pool = [v for v in context.unseen(context.catalogue) if v.slant * context.side > 0]
    return _draw(rng, pool, context.size)


def cross_cutting(context: Context, rng: np.random.Generator) -> list[str]:
    """Videos slanted against the viewer's side (slant times side < 0), at random."""
    pool = [v for v in context.unseen(context.catalogue) if v.slant * context.side < 0]
    return _draw(rng, pool, context.size)


def popularity(context: Context, rng: np.random.Generator) -> list[str]:
    """The most viewed unwatched videos, most viewed first (`rng` unused: the same viewer
    history gets the same slate)."""
    ranked = sorted(context.unseen(context.catalogue), key=lambda v: (-v.views, v.id))
    return [v.id for v in ranked[: context.size]]


def uniform(context: Context, rng: np.random.Generator) -> list[str]:
    """Any unwatched video of the issue, at random."""
    return _draw(rng, context.unseen(context.catalogue), context.size)


RECOMMENDERS: dict[str, Recommender] = {
    "factual": factual,
    "like_minded": like_minded,
    "cross_cutting": cross_cutting,
    "popularity": popularity,
    "random": uniform,
    "replayed": replayed,
}


def slate_size(rng: np.random.Generator, sizes: dict[int, float]) -> int:
    """A slate size from the study's distribution (size -> share)."""
    keys = sorted(sizes)
    return int(
        keys[rng.choice(len(keys), p=np.array([sizes[k] for k in keys]) / sum(sizes.values()))]
    )
