"""What the compare task does: the algorithms of this run compared per issue, into the
parent MLflow run."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported


@reported("compare")
def compare_task(results: list[str], parent: str, out_json: str, out_markdown: str) -> dict:
    """The algorithms of this run compared per issue (:func:`grail.benchmark.stage.compare`:
    the task's ``compare`` part): the comparison and its report to the given paths and to the
    parent MLflow run; returns the differences (the task's ``compare_headline``)."""
    from grail.benchmark.stage import compare, scored_by

    with tempfile.TemporaryDirectory() as tmp:  # under their own names in MLflow
        folder = Path(tmp) / "compare"
        comparison = compare(results, folder)
        named = [folder / "comparison.json", folder / "comparison.md"]
        shutil.copyfile(named[0], out_json)
        shutil.copyfile(named[1], out_markdown)
        values = scored_by(results).compare_headline(comparison)
        pipeline_run = tracking.pipeline_parent(parent)
        tracking.log_metrics(pipeline_run, values)
        tracking.log_artifacts(pipeline_run, named, "compare")
    return values


def run_compare(*, results: list, parent_run: str, comparison, report, metrics) -> None:
    """The compare component's body: :func:`compare_task` over every branch's `results`
    into the `comparison` and `report` artifacts, the differences into `metrics`."""
    values = compare_task([r.path for r in results], parent_run, comparison.path, report.path)
    for name, value in values.items():
        metrics.log_metric(name, value)
