"""KFP component for stage export: model, benchmark and manifest to S3 (or a folder)."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def export(
    model: Input[Model],
    results: Input[Artifact],
    destination: str,
    run_name: str,
    kfp_run_id: str,
    issue: str,
    algorithm: str,
    parent_run: str,
    manifest: Output[Artifact],
    metrics: Output[Metrics],
):
    """Copy what changed to `destination/RUN/ALGORITHM/ISSUE` (RUN: `run_name`, else the KFP
    run id), so no run or algorithm replaces another's; the manifest (sha256 per file) as
    output."""
    from grail.components.export.task import export_task

    counts = export_task(
        model.path,
        results.path,
        destination,
        run_name or kfp_run_id,
        issue,
        algorithm,
        parent_run,
        manifest.path,
    )
    for name, value in counts.items():
        metrics.log_metric(f"files_{name}", value)
