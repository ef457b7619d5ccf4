"""KFP component for stage clean: the raw export (or a simulated study) to the cleaned dataset,
for either task."""

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
    task: str = "slate",
    documents: int = 0,
    validation_documents: int = 91,
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
        metrics: Rows in, rows kept and participants kept (documents: rows, documents and
            validation documents).
        task: slate (the study's sessions) or summarize (documents in RepLiQA's layout:
            raw_uri hf:ServiceNow/repliqa, s3://, file://; empty simulates `documents`).
        documents: Documents of the simulated study (task summarize; 0: 300).
        validation_documents: Documents held out for validation (task summarize), drawn with
            `seed` as Summary-RL does (seed 80, 91 documents).
    """
    from grail.components.clean.task import run_clean

    run_clean(
        raw_uri=raw_uri,
        participants=participants,
        seed=seed,
        validation_fraction=validation_fraction,
        parent_run=parent_run,
        dataset=dataset,
        audit=audit,
        metrics=metrics,
        task=task,
        documents=documents,
        validation_documents=validation_documents,
    )
