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
    """Clean the study's raw export into one row per step, split by participant.

    Args:
        raw_uri: The raw export: s3://, file:// or a path; empty simulates a study.
        participants: Participants of the simulated study when raw_uri is empty (0: as the
            real study).
        seed: Seed of the simulated study and of the participant split.
        validation_fraction: Share of participants in the validation split.
        parent_run: The pipeline's parent MLflow run ("" when tracking is off).
        dataset: The cleaned dataset (train and validation parquet, truth tables, audit.json).
        audit: The audit as Markdown: slate sizes, gold positions, position baselines.
        metrics: Rows in, rows kept and participants kept.
    """
    from grail.components.clean.task import run_clean

    run_clean(raw_uri, participants, seed, validation_fraction, parent_run, dataset, audit, metrics)
