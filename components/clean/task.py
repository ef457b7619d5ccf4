"""What the clean task does: simulate or fetch the raw export, clean it, track it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported
from grail.tasks.slate.contract import fingerprint


@reported("clean")
def clean_task(
    raw_uri: str,
    participants: int,
    seed: int,
    validation_fraction: float,
    parent: str,
    out: str,
    audit_markdown: str,
) -> dict:
    """Simulate a study when ``raw_uri`` is empty, else read the raw export; clean it."""
    from grail.clean.stage import clean
    from grail.core.storage import Location, download_folder
    from grail.tasks.slate.simulate import simulate

    params = {
        "raw_uri": raw_uri or f"synthetic:{participants}",
        "seed": seed,
        "validation_fraction": validation_fraction,
    }
    with (
        tracking.stage_run(parent, "clean", params) as run_id,
        tempfile.TemporaryDirectory() as tmp,
    ):
        raw = Path(tmp) / "raw"
        if not raw_uri:
            simulate(raw, participants=participants or None, seed=seed)
        elif raw_uri.startswith("s3://"):
            download_folder(Location.parse(raw_uri), raw)
        else:
            raw = Path(raw_uri.removeprefix("file://"))
        report = clean(raw, out, validation_fraction=validation_fraction, seed=seed)
        shutil.copyfile(Path(out) / "audit.md", audit_markdown)
        accounting = report["accounting"]
        tracking.log_params(
            tracking.pipeline_parent(parent), {"dataset_fingerprint": fingerprint(Path(out))}
        )
        tracking.log_metrics(
            run_id, {k: accounting[k] for k in ("rows_kept", "rows_in", "participants_kept")}
        )
        tracking.log_artifacts(run_id, [Path(out) / "audit.md", Path(out) / "audit.json"], "audit")
    return accounting


@reported("clean")
def clean_documents_task(
    raw_uri: str, documents: int, seed: int, validation_documents: int, parent: str, out: str,
    audit_markdown: str,
) -> dict:  # fmt: skip
    """The summarize task's clean: a synthetic document study of `documents` when ``raw_uri``
    is empty, else RepLiQA (``hf:ServiceNow/repliqa``, s3://, file:// or a path in its layout),
    one row per document split by document with `seed` (Summary-RL's 80)."""
    from grail.core.storage import Location, download_folder
    from grail.tasks.summarize.clean import clean_documents
    from grail.tasks.summarize.documents import simulate_documents
    from grail.tasks.summarize.report import audit_markdown as markdown

    params = {
        "raw_uri": raw_uri or f"synthetic:{documents}",
        "seed": seed,
        "validation_documents": validation_documents,
    }
    with (
        tracking.stage_run(parent, "clean", params) as run_id,
        tempfile.TemporaryDirectory() as tmp,
    ):
        raw: str | Path = Path(tmp) / "raw"
        if not raw_uri:
            simulate_documents(raw, documents=documents or 300, seed=seed)
        elif raw_uri.startswith("s3://"):
            download_folder(Location.parse(raw_uri), Path(raw))
        else:
            raw = raw_uri.removeprefix("file://")
        audit = clean_documents(raw, out, validation_documents=validation_documents, seed=seed)
        Path(audit_markdown).write_text(markdown(audit))
        tracking.log_params(
            tracking.pipeline_parent(parent), {"dataset_fingerprint": fingerprint(Path(out))}
        )
        counts = {k: audit[k] for k in ("rows", "documents", "validation_documents")}
        tracking.log_metrics(run_id, counts)
        tracking.log_artifacts(run_id, [Path(out) / "audit.json"], "audit")
    return counts


def run_clean(
    raw_uri: str,
    participants: int,
    seed: int,
    validation_fraction: float,
    parent_run: str,
    dataset,
    audit,
    metrics,
    task: str = "slate",
    documents: int = 0,
    validation_documents: int = 91,
) -> None:
    """The clean component's body: :func:`clean_task` (or for the summarize task
    :func:`clean_documents_task`) into the `dataset` and `audit` artifacts (anything with a
    ``path``), its row accounting into `metrics` (anything with ``log_metric``)."""
    if task == "summarize":
        counts = clean_documents_task(
            raw_uri, documents, seed, validation_documents, parent_run, dataset.path, audit.path
        )
    else:
        accounting = clean_task(
            raw_uri, participants, seed, validation_fraction, parent_run, dataset.path, audit.path
        )
        counts = {k: accounting[k] for k in ("rows_in", "rows_kept", "participants_kept")}
    for name, value in counts.items():
        metrics.log_metric(name, value)
