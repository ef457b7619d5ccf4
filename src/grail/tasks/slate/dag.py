"""The slate task's DAG (``pipelines/grail.yaml``): its own parameters (the study's size and
split, the issues, the counterfactual sessions) and the shared ones it sets otherwise; built
by ``grail.pipelines.dag``."""

from __future__ import annotations

from grail.tasks import Dag, Parameter
from grail.tasks.slate.policy_issues import ISSUES

# grail counterfactual's defaults (a test holds them equal; the DAG's module loads no stage)
RECOMMENDERS = ["factual", "like_minded", "cross_cutting", "popularity", "random", "replayed"]


def clean_inputs(params: dict) -> dict:
    """The clean component's study inputs: participants and the participant split."""
    return {
        "raw_uri": params["raw_uri"],
        "participants": params["participants"],
        "seed": params["seed"],
        "validation_fraction": params["validation_fraction"],
    }


DAG = Dag(
    name="grail",
    file="grail.yaml",
    description="Train and benchmark LLM viewers of recommendation slates with GRPO / GRAIL, "
    "from a study's raw export to an exported model.",
    parameters=(
        Parameter(
            "participants",
            int,
            0,
            "Size of the simulated study when raw_uri is empty (0 = the real size).",
        ),
        Parameter(
            "validation_fraction", float, 0.1, "Share of participants in the validation split."
        ),
        Parameter("issues", list, list(ISSUES), "The issues to train (gun_control, minimum_wage)."),
        Parameter(
            "counterfactual_viewers",
            int,
            40,
            "Validation participants per issue whose sessions every trained model, baseline "
            "and the truth roll out under each recommender (docs/counterfactual.md); 0 skips "
            "the counterfactual task. A real study (no truth) runs the replayed arm against "
            "people's sessions alone.",
        ),
        Parameter("counterfactual_steps", int, 5, "Clicks per counterfactual session."),
        Parameter(
            "counterfactual_recommenders",
            list,
            RECOMMENDERS,
            "The recommenders rolled out (factual, like_minded, cross_cutting, popularity, "
            "random, replayed).",
        ),
    ),
    defaults={
        "raw_uri": (
            "",
            "The study's raw export (s3:// or file://; the CodeOcean capsule or grail's "
            "layout). Empty simulates a study of `participants` people.",
        ),
        "seed": (2024, "Seed of the simulated study and of the participant split."),
        "recipe": (
            "recipes/Qwen2.5-1.5B-Instruct/grpo/config_{algorithm}_{issue}.yaml",
            "Training recipe path; {algorithm} (grpo, grail or bc) and {issue} (gun or wage) "
            "are filled in per branch.",
        ),
        "algorithms": (
            ["grpo", "grail"],
            "The algorithms to train on each issue, one parallel branch per issue and "
            "algorithm, compared per issue: grpo, grail (GRPO plus the GAIL discriminator "
            "reward), bc (behaviour cloning: SFT on the train split's own choices, no RL).",
        ),
        "promote_if": (
            "beats_prior",
            "The promotion gate's rule: beats_prior (a model whose held-out log-loss minus "
            "always-first's has a paired 95% interval below 0, and no collapse, gets the "
            "registered model's champion alias), always or never. Every model is exported; "
            "one not promoted is marked promoted: false with the reason.",
        ),
    },
    clean_inputs=clean_inputs,
    subjects="issues",
)
