"""KFP component comparing the algorithms of a run per issue (GRAIL minus GRPO)."""

from typing import List  # noqa: UP035 (KFP reads the annotation)

from kfp import dsl
from kfp.dsl import Artifact, Input, Markdown, Metrics, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def compare(
    results: Input[List[Artifact]],  # noqa: UP006
    parent_run: str,
    comparison: Output[Artifact],
    report: Output[Markdown],
    metrics: Output[Metrics],
):
    """Compare the algorithms of this run on each issue, paired on the same rows.

    Args:
        results: Every branch's benchmark results (the benchmark component's results).
        parent_run: The pipeline's parent MLflow run ("" when tracking is off); the
            comparison is logged there too.
        comparison: comparison.json: per issue, each algorithm's final model and the paired
            differences between algorithms (participant bootstrap).
        report: The comparison as Markdown.
        metrics: The paired differences (compare/ISSUE/B_minus_A/METRIC).
    """
    from grail.components.compare.task import run_compare

    run_compare(
        results=results,
        parent_run=parent_run,
        comparison=comparison,
        report=report,
        metrics=metrics,
    )
