"""KFP component for stage clean: the raw export (or a simulated study) to the cleaned dataset."""

from kfp import dsl
from kfp.dsl import Dataset, Markdown, Metrics, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def clean(
    raw_uri: str,
    participants: int,
    seed: int,
    validation_fraction: float,
    parent_run: str,
    dataset: Output[Dataset],
    audit: Output[Markdown],
    metrics: Output[Metrics],
):
    """Clean `raw_uri` (s3://, file:// or a path; empty: simulate `participants`)."""
    from grail.components.clean.task import clean_task

    accounting = clean_task(
        raw_uri, participants, seed, validation_fraction, parent_run, dataset.path, audit.path
    )
    for name in ("rows_in", "rows_kept", "participants_kept"):
        metrics.log_metric(name, accounting[name])
