"""What the clean task does: simulate or fetch the raw export, clean it, track it; each task's
parts (its study, cleaning, audit and counts) from the registry."""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path

from grail.clean.config import CleanConfig
from grail.core import tracking
from grail.core.errors import reported
from grail.tasks import TASKS


@reported("clean")
def clean_task(
    *, raw_uri: str, participants: int, documents: int, config: CleanConfig, parent: str,
    audit_markdown: str,
) -> dict:  # fmt: skip
    """Simulate the task's study when ``raw_uri`` is empty (`participants` or `documents`,
    whichever the task's study counts), else read the raw export (s3:// is downloaded first);
    clean it into ``config.out`` (:func:`grail.clean.stage.clean`); returns the audit's
    counts (the task's ``audit_counts``)."""
    from grail.clean.stage import clean, fingerprint
    from grail.core.storage import Location, download_folder

    task = TASKS[config.task]
    settings = task.clean_params(config, participants, documents)
    size = settings.pop("synthetic")
    params = {"raw_uri": raw_uri or f"synthetic:{size}", "seed": config.seed, **settings}
    with (
        tracking.stage_run(parent, "clean", params) as run_id,
        tempfile.TemporaryDirectory() as tmp,
    ):
        raw: str | Path = Path(tmp) / "raw"
        if not raw_uri:
            task.simulate(raw, participants, documents, config.seed, "grail")  # 0: the default size
        elif raw_uri.startswith("s3://"):
            download_folder(Location.parse(raw_uri), Path(raw))
        else:
            raw = raw_uri.removeprefix("file://")
        options = {k: v for k, v in asdict(config).items() if k not in ("raw", "out")}
        report = clean(raw, config.out, **options)
        Path(audit_markdown).write_text(task.audit_markdown(report))
        out = Path(config.out)
        tracking.log_params(
            tracking.pipeline_parent(parent), {"dataset_fingerprint": fingerprint(out)}
        )
        counts = task.audit_counts(report)
        tracking.log_metrics(run_id, counts)
        audits = [out / name for name in ("audit.md", "audit.json") if (out / name).is_file()]
        tracking.log_artifacts(run_id, audits, "audit")
    return counts


def run_clean(
    *,
    raw_uri: str,
    participants: int,
    seed: int,
    validation_fraction: float,
    parent_run: str,
    dataset,
    audit,
    metrics,
    task: str,
    documents: int = 0,
    validation_documents: int = 91,
) -> None:
    """The clean component's body: :func:`clean_task` into the `dataset` and `audit` artifacts
    (anything with a ``path``), the audit's counts into `metrics` (anything with
    ``log_metric``). `seed` seeds the study and the split (the participants' or the
    documents')."""
    config = settings(
        raw=raw_uri,
        out=dataset.path,
        task=task,
        validation_fraction=validation_fraction,
        seed=seed,
        validation_documents=validation_documents,
        document_split_seed=seed,
    )
    counts = clean_task(
        raw_uri=raw_uri,
        participants=participants,
        documents=documents,
        config=config,
        parent=parent_run,
        audit_markdown=audit.path,
    )
    for name, value in counts.items():
        metrics.log_metric(name, value)


@reported("clean")
def settings(**fields) -> CleanConfig:
    """The clean settings from the DAG's arguments; a wrong one fails the task with its own
    line (``validation_documents: expected at least 1, got 0``), not as a crash."""
    return CleanConfig(**fields)
