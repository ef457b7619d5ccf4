"""What the export task does: one branch's model and benchmark to
``destination/RUN/ALGORITHM/ISSUE``, registered by reference when tracking."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported
from grail.core.outputs import read_benchmark
from grail.core.storage import run_folder
from grail.export.registry import check_destination_free, register_export


def export_location(destination: str, run: str, algorithm: str, issue: str) -> str:
    """Where one branch of one run is exported: no run or algorithm replaces another's.

    >>> export_location("s3://b/exports/", "run-7", "grpo", "gun_control")
    's3://b/exports/run-7/grpo/gun_control'
    """
    return run_folder(destination, run, "run name", algorithm, issue)


@reported("export")
def export_task(
    *,
    model: str,
    results: str,
    destination: str,
    run: str,
    issue: str,
    algorithm: str,
    parent: str,
    out: str,
    decision: str | None = None,
) -> dict:
    """Export one branch's model and benchmark to ``destination/RUN/ALGORITHM/ISSUE``
    (:func:`export_location`); manifest to `out`. When tracking, the destination is an MLflow
    model registered by reference as a new version of the branch's registered model, described
    by the benchmark's headline (`results`). `decision`: the promotion gate's
    (:mod:`grail.export.promotion`), recorded in the manifest and the registry; only a
    promoted version gets the registered model's champion alias."""
    from grail.benchmark.stage import headline
    from grail.export.promotion import read_decision
    from grail.export.stage import export

    where = export_location(destination, run, algorithm, issue)
    # about this branch's benchmark, and what its rule decides on it, or refused
    summary = headline(read_benchmark(Path(results))) if decision is not None else None
    promotion = read_decision(decision, results, summary)
    params = {"destination": where, "issue": issue, "algorithm": algorithm}
    with tracking.stage_run(parent, f"export:{issue}:{algorithm}", params) as run_id:
        if run_id:  # before any byte moves: the destination backs no other run's version
            check_destination_free(parent, issue, algorithm, where)
        exported = export(
            model,
            results,
            where,
            run_ids={"pipeline": parent, "export": run_id or ""},
            mlflow_model=bool(run_id),
            promotion=promotion,
            checkpoint="best",  # the benchmark's choice (grail.core.selection)
        )
        Path(out).write_text(json.dumps(exported["manifest"], indent=1))
        with tempfile.TemporaryDirectory() as tmp:  # under its own name in MLflow
            named = shutil.copyfile(out, Path(tmp) / "manifest.json")
            tracking.log_artifacts(run_id, [named], "export")
        tracking.log_metrics(
            run_id, {f"files_{name}": len(exported[name]) for name in ("uploaded", "skipped")}
        )
        if run_id:
            benchmark = read_benchmark(Path(results))
            summary = headline(benchmark)
            register_export(run_id, issue, algorithm, where, summary, promotion)
    return {name: len(exported[name]) for name in ("uploaded", "skipped", "deleted")}


def run_export(
    *,
    model,
    results,
    destination: str,
    run_name: str,
    kfp_run_id: str,
    issue: str,
    algorithm: str,
    parent_run: str,
    manifest,
    metrics,
    decision=None,
) -> None:
    """The export component's body: :func:`export_task` under the run's name (else the KFP
    run id), the manifest into the `manifest` artifact, the file counts into `metrics`;
    `decision`: the promotion gate's artifact."""
    counts = export_task(
        model=model.path,
        results=results.path,
        destination=destination,
        run=run_name or kfp_run_id,
        issue=issue,
        algorithm=algorithm,
        parent=parent_run,
        out=manifest.path,
        decision=decision.path if decision is not None else None,
    )
    for name, value in counts.items():
        metrics.log_metric(f"files_{name}", value)
