"""What the counterfactual task does: a branch's trained model, its step 0, the baselines and
the truth roll out every recommender on the issue's viewers
(the task's ``counterfactual_branch``); the effects' errors, the replayed arm's differences
from people and the verdicts go to the parent MLflow run."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import GrailError, reported
from grail.core.progress import show_progress
from grail.tasks import TASKS, recorded_task


def start_of(model: str, base_models: str) -> str | None:
    """Step 0: the tiny policy (`base_models` given), else the local folder the training
    started from (its summary.json), else none (step 0 is left out)."""
    if base_models:
        return str(Path(base_models) / "policy")
    summary = Path(model) / "summary.json"
    start = json.loads(summary.read_text()).get("start_model") if summary.is_file() else None
    return start if start and Path(start).is_dir() else None


@reported("counterfactual")
def counterfactual_task(
    *, dataset: str, model: str, base_models: str, issue: str, algorithm: str,
    recommenders: list[str], viewers: int, steps: int, seed: int, parent: str, out: str,
) -> dict[str, float]:  # fmt: skip
    """The branch's counterfactual sessions under `out`; returns the headline metrics, also
    logged to the pipeline's parent run with the report."""
    show_progress()
    sessions = TASKS[recorded_task(dataset)].counterfactual_branch
    if sessions is None:
        raise GrailError(f"{dataset}: its task has no counterfactual sessions")
    params = {"issue": issue, "algorithm": algorithm, "viewers": viewers, "steps": steps}
    with tracking.stage_run(parent, f"counterfactual:{issue}:{algorithm}", params) as own:
        values = sessions(
            dataset=dataset,
            out=out,
            model=model,
            algorithm=algorithm,
            start_model=start_of(model, base_models),
            recommenders=list(recommenders),
            viewers=viewers,
            steps=steps,
            seed=seed,
            subject=issue,
        )
        values = {k: round(v, 6) for k, v in values.items()}
        tracking.log_metrics(own, values)
        with tempfile.TemporaryDirectory() as tmp:  # under their own names in MLflow
            named = shutil.copyfile(Path(out) / "report.md", Path(tmp) / f"{issue}-{algorithm}.md")
            tracking.log_artifacts(own, [named, Path(out) / "outcomes.svg"], "counterfactual")
            pipeline_run = tracking.pipeline_parent(parent)
            tracking.log_metrics(pipeline_run, values)
            tracking.log_artifacts(pipeline_run, [named], "counterfactual")
    return values


def run_counterfactual(
    *, dataset, model, base_models, tiny_model: bool, issue: str, algorithm: str,
    recommenders, viewers: int, steps: int, seed: int, parent_run: str, outcomes, report,
    charts, metrics,
) -> None:  # fmt: skip
    """The counterfactual component's body: :func:`counterfactual_task` into `outcomes`; the
    report and the chart also into their own artifacts for the Kubeflow UI; the headline into
    `metrics`."""
    values = counterfactual_task(
        dataset=dataset.path,
        model=model.path,
        base_models=base_models.path if tiny_model else "",
        issue=issue,
        algorithm=algorithm,
        recommenders=recommenders,
        viewers=viewers,
        steps=steps,
        seed=seed,
        parent=parent_run,
        out=outcomes.path,
    )
    shutil.copyfile(Path(outcomes.path) / "report.md", report.path)
    svg = (Path(outcomes.path) / "outcomes.svg").read_text()
    Path(charts.path).write_text(f"<html><body>{svg}</body></html>")
    for name, value in values.items():
        metrics.log_metric(name, value)
