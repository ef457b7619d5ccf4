"""The counterfactual stage's settings (``grail counterfactual``): every field with its help
and default, read by the one parser and the generated CLI reference."""

from __future__ import annotations

from dataclasses import dataclass

from grail.core.config import option
from grail.core.errors import GrailError
from grail.tasks.slate.counterfactual.recommenders import RECOMMENDERS

BASELINES = ("position_prior", "ranker")
# The default effect is one whose truth depends on what the viewer reads: a random slate mixes
# both sides, so what is clicked there is the viewer's choice; a like-minded or cross-cutting
# slate holds one side's videos only, so its clicked slant is the recommender's (measured on
# the demo's study, 150 viewers: like_minded-cross_cutting's slant effect is +1.534 true,
# +1.488 under the position prior, +1.520 under the ranker: nothing tells them apart).
EFFECT_PAIR = ("random", "cross_cutting")
DEFAULT_EFFECT = ["-".join(EFFECT_PAIR)]
# The outcomes an effect's verdict judges (drift and reach are too noisy at these sizes) ...
JUDGED = ("slant", "opinion_shift")
# ... and the outcomes judged as they are under one recommender: the like-minded click share
# on balanced slates, where it is the viewer's doing (on a one-sided slate it is the
# recommender's alone, the same for every simulator).
JUDGED_LEVELS = (("random", "like_minded"), ("factual", "like_minded"))


@dataclass(kw_only=True)
class CounterfactualConfig:
    """grail counterfactual: sessions under other recommenders, simulated and true; the slates
    people were shown, replayed, against people's sessions."""

    data: str = option(
        "Cleaned study: a synthetic one (grail simulate + grail clean) is scored against its "
        "truth and against people; a real one (no truth.json) against people on the replayed "
        "arm alone."
    )
    out: str = option("Output folder.")
    models: list[str] = option(
        "Trained model folder, NAME=FOLDER to name it; repeatable (the final model of each "
        "algorithm).",
        [],
        aliases=["--model"],
        action="extend",
        metavar="SPEC",
    )
    start_model: str | None = option(
        "The models' starting point, simulated as step_0 (the tiny policy on the demo).", None
    )
    recommenders: list[str] = option(
        "Recommenders to roll out: " + ", ".join(RECOMMENDERS) + ".",
        list(RECOMMENDERS),
        action="extend",
        metavar="NAME",
    )
    baselines: list[str] = option(
        "Baselines that give a distribution: position_prior (the train split's click share of "
        "each position), ranker.",
        list(BASELINES),
        action="extend",
        metavar="NAME",
    )
    issue: str | None = option(
        "Sample viewers of this issue only (gun_control, minimum_wage; default: every issue).",
        None,
    )
    viewers: int = option("Validation participants sampled (one session each per cell).", 40)
    steps: int = option("Clicks per session.", 5)
    seed: int = option("Seed of the viewer sample, the slates and the clicks.", 0)
    effect: list[str] = option(
        "Recommender effects A-B to predict; repeatable (the default only when both its "
        "recommenders are rolled out).",
        list(DEFAULT_EFFECT),
        action="extend",
        metavar="A-B",
    )
    bootstrap: int = option("Viewer-bootstrap replicates per interval.", 500)
    batch_size: int = option("Prompts per model batch.", 64)
    backend: str = option("Local model backend: auto, transformers or vllm.", "auto")
    thought_samples: int = option(
        "Local models that think: sampled thoughts per state whose option distributions are "
        "mixed (as grail benchmark reads them); 0: the greedy thought's alone.",
        8,
    )

    def __post_init__(self):
        unknown = [r for r in self.recommenders if r not in RECOMMENDERS]
        if unknown:
            raise GrailError(
                f"recommenders: unknown {', '.join(unknown)} (known: {', '.join(RECOMMENDERS)})"
            )
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise GrailError(
                f"baselines: unknown {', '.join(unknown)} (known: position_prior, ranker)"
            )
        if self.effect == DEFAULT_EFFECT and not set(EFFECT_PAIR) <= set(self.recommenders):
            self.effect = []  # the default effect, its recommenders not rolled out: none
        for text in self.effect:
            a, _, b = text.partition("-")
            if a not in self.recommenders or b not in self.recommenders:
                raise GrailError(f"effect {text}: expected A-B with A and B among --recommenders")
        for name in ("bootstrap", "batch_size"):
            if getattr(self, name) < 1:
                raise GrailError(f"{name}: expected at least 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise GrailError(f"seed: expected 0 or more, got {self.seed}")
        if self.thought_samples < 0:
            raise GrailError(
                f"thought_samples: expected 0 (greedy) or more, got {self.thought_samples}"
            )
        if self.viewers < 1 or self.steps < 1:
            raise GrailError("viewers and steps must be at least 1")
