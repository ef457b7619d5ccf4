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
    """Every branch's benchmark results in; per issue, each algorithm's final model and the
    paired differences between algorithms (participant bootstrap) out, also on the parent
    MLflow run."""
    from grail.components.compare.task import compare_task

    values = compare_task([r.path for r in results], parent_run, comparison.path, report.path)
    for name, value in values.items():
        metrics.log_metric(name, value)
