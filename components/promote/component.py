"""KFP component for the promotion gate: whether a branch's benchmarked model may become the
registered model's champion."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def promote(
    results: Input[Artifact],
    promote_if: str,
    issue: str,
    algorithm: str,
    parent_run: str,
    decision: Output[Artifact],
    metrics: Output[Metrics],
) -> NamedTuple("Decided", promoted=bool, reason=str):
    """Decide whether this branch's model is promoted, from its benchmark: with promote_if
    beats_prior, a slate simulator whose held-out log-loss minus always-first's has a paired
    95% interval wholly below 0 (and that did not collapse), or a summarizer whose share
    answered beats the best baseline by its interval. The export that follows sets the
    registered model's champion alias only on a promoted model, and exports the others marked
    promoted: false with the reason.

    Args:
        results: The benchmark's results (the benchmark component's results).
        promote_if: beats_prior (the rule above), always or never.
        issue: The branch's issue (gun_control, minimum_wage; summarize).
        algorithm: The branch's algorithm (grpo, grail, bc).
        parent_run: The pipeline's parent MLflow run ("" when tracking is off); the decision
            is tagged there (promotion/ISSUE/ALGORITHM).
        decision: decision.json: promoted (true or false), the rule and the reason in words.
        metrics: promoted (1 or 0).

    Returns:
        promoted: Whether the model is promoted.
        reason: The decision in words ("beats always-first: log-loss -0.020 [-0.040,
            -0.010]", "no better than always-first: ...", "promote_if: never").
    """
    from grail.components.promote.task import run_promote

    return run_promote(
        results=results,
        promote_if=promote_if,
        issue=issue,
        algorithm=algorithm,
        parent_run=parent_run,
        decision=decision,
        metrics=metrics,
    )
