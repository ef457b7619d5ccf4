"""What the compare task does: the algorithms of this run compared per issue, into the
parent MLflow run."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported


@reported("compare")
def compare_task(results: list[str], parent: str, out_json: str, out_markdown: str) -> dict:
    """The algorithms of this run compared per issue (:mod:`grail.benchmark.compare`): the
    comparison and its report to the given paths and to the parent MLflow run; returns the
    differences."""
    from grail.benchmark.compare import compare, compare_headline, markdown

    comparison = compare([Path(r) for r in results])
    Path(out_json).write_text(json.dumps(comparison, indent=1) + "\n")
    Path(out_markdown).write_text(markdown(comparison))
    values = compare_headline(comparison)
    pipeline_run = tracking.pipeline_parent(parent)
    tracking.log_metrics(pipeline_run, values)
    with tempfile.TemporaryDirectory() as tmp:  # under their own names in MLflow
        named = [
            shutil.copyfile(out_json, Path(tmp) / "comparison.json"),
            shutil.copyfile(out_markdown, Path(tmp) / "comparison.md"),
        ]
        tracking.log_artifacts(pipeline_run, named, "compare")
    return values


def run_compare(*, results: list, parent_run: str, comparison, report, metrics) -> None:
    """The compare component's body: :func:`compare_task` over every branch's `results`
    into the `comparison` and `report` artifacts, the differences into `metrics`."""
    values = compare_task([r.path for r in results], parent_run, comparison.path, report.path)
    for name, value in values.items():
        metrics.log_metric(name, value)
