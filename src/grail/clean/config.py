"""The clean stage's settings (``grail clean``): the pipeline reads its defaults from here
without importing the stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from grail.core.config import option
from grail.core.errors import GrailError
from grail.tasks import Task


@dataclass(kw_only=True)
class CleanConfig:
    """grail clean: raw export -> rows and the audit. Task slate: one row per step, split by
    participant; task summarize: one row per document, split by document."""

    raw: str = option(
        "Raw export folder (real or simulated); task summarize: RepLiQA's layout (a .jsonl or "
        ".parquet file, a folder of them, or hf:ServiceNow/repliqa)."
    )
    out: str = option("Output folder for the parquet files and the audit.")
    task: Task = option("slate (one row per step) or summarize (one row per document).", "slate")
    validation_documents: int = option(
        "Task summarize: documents in the validation split (Summary-RL's 91).", 91
    )
    document_split_seed: int = option(
        "Task summarize: seed of the document shuffle (Summary-RL's 80).", 80
    )
    repliqa_split: str = option("Task summarize, hf: source: RepLiQA's split.", "repliqa_0")
    validation_fraction: float = option("Share of participants in the validation split.", 0.1)
    seed: int = option("Seed of the participant split.", 2024)
    opinion_tolerance: float = option("Opinion changes within this are labelled no_change.", 0.05)

    def __post_init__(self):
        if not 0.0 <= self.opinion_tolerance <= 1.0:
            raise GrailError(
                f"opinion_tolerance: expected a number on [0, 1], got {self.opinion_tolerance}"
            )
        if not 0.0 <= self.validation_fraction < 1.0:
            raise GrailError(
                f"validation_fraction: expected a number on [0, 1), got {self.validation_fraction}"
            )
        if self.validation_documents < 1:
            raise GrailError(
                f"validation_documents: expected at least 1, got {self.validation_documents}"
            )


@dataclass(kw_only=True)
class AuditConfig:
    """grail audit: position baselines and leakage detectors of a cleaned dataset."""

    path: str | None = option("Cleaned folder or one parquet file in the contract.", None)
    json: str | None = option("Also write the report as JSON here.", None)

    POSITIONAL: ClassVar[tuple[str, ...]] = ("path",)

    def __post_init__(self):
        if not self.path:
            raise GrailError("the following argument is required: path")
