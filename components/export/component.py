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
    decision: Input[Artifact],
    manifest: Output[Artifact],
    metrics: Output[Metrics],
):
    """Export one branch's model and benchmark to destination/RUN/ALGORITHM/ISSUE, so no run
    or algorithm replaces another's; only what changed is copied. A model the promotion gate
    did not promote is exported all the same, marked promoted: false.

    Args:
        model: The trained model (the train component's model).
        results: The benchmark's results (the benchmark component's results).
        destination: s3://bucket/prefix, file://path or a path.
        run_name: RUN in the destination's keys; empty uses kfp_run_id.
        kfp_run_id: The KFP run's id.
        issue: The branch's issue (gun_control, minimum_wage).
        algorithm: The branch's algorithm (grpo, grail, bc).
        parent_run: The pipeline's parent MLflow run ("" when tracking is off); with
            tracking, the export is registered as a new model version by reference.
        decision: The promotion gate's decision (the promote component's decision): recorded
            in the manifest (promoted: true or false, and why); only a promoted model gets
            the registered model's champion alias.
        manifest: The manifest: every exported file with its sha256.
        metrics: Files uploaded and skipped (unchanged).
    """
    from grail.components.export.task import run_export

    run_export(
        model=model,
        results=results,
        destination=destination,
        run_name=run_name,
        kfp_run_id=kfp_run_id,
        issue=issue,
        algorithm=algorithm,
        parent_run=parent_run,
        manifest=manifest,
        metrics=metrics,
        decision=decision,
    )
